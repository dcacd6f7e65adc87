"""The operator's own Prometheus metrics (served by ``--metrics-port``)."""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter(
    "radixserve_operator_reconciles_total",
    "InferenceService reconciles, by result (applied, invalid, failed).",
    ["result"],
)
ERRORS = Counter(
    "radixserve_operator_errors_total",
    "API or handler errors, by the step that failed.",
    ["step"],
)
RECONCILE_SECONDS = Histogram(
    "radixserve_operator_reconcile_duration_seconds",
    "Wall time of one InferenceService reconcile.",
)
SERVICE_READY = Gauge(
    "radixserve_operator_inferenceservice_ready",
    "1 when the InferenceService's Ready condition is True; series removed on delete.",
    ["namespace", "name"],
)


def record_ready(namespace: str, name: str, status: dict) -> None:
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
    )
    SERVICE_READY.labels(namespace, name).set(1 if ready else 0)


def forget_service(namespace: str, name: str) -> None:
    """Drop the per-service series so a deleted service leaves nothing behind."""
    with contextlib.suppress(KeyError):
        SERVICE_READY.remove(namespace, name)
