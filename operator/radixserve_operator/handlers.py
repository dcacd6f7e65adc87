"""kopf handlers: thin adapters from kopf's causes to ``reconcile`` and ``refresh_status``.

Registered on import (``kopf run -m radixserve_operator.handlers`` or ``main.run``).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import kopf
import kubernetes

from radixserve_operator import FIELD_MANAGER, GROUP, PLURAL, VERSION
from radixserve_operator.kube import KubeApi
from radixserve_operator.metrics import (
    ERRORS,
    RECONCILE_SECONDS,
    RECONCILES,
    forget_service,
    record_ready,
)
from radixserve_operator.reconcile import (
    OperatorContext,
    Outcome,
    reconcile,
    refresh_status,
)

MANAGED_CHILDREN = {"app.kubernetes.io/managed-by": FIELD_MANAGER}
DEFAULT_WORKER_IMAGE = "ghcr.io/radixserve/radixserve:0.1.0"
DEFAULT_PROMETHEUS_ADDRESS = "http://prometheus-operated.monitoring.svc:9090"


@kopf.on.startup()
def connect(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Build the API client once; config comes from ``main`` (or defaults under ``kopf run``)."""
    kubernetes.config.load_config()
    memo.context = OperatorContext(
        api=KubeApi(kubernetes.client.ApiClient()),
        default_image=memo.get("worker_image", DEFAULT_WORKER_IMAGE),
        prometheus_address=memo.get("prometheus_address", DEFAULT_PROMETHEUS_ADDRESS),
    )
    logger.info("radixserve operator connected")


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def reconcile_service(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Apply the children and write the status; invalid specs end as Degraded, not retries."""
    plain = plain_dict(body)
    with RECONCILE_SECONDS.time():
        try:
            outcome = reconcile(memo.context, plain, now())
        except Exception:
            ERRORS.labels("reconcile").inc()
            RECONCILES.labels("failed").inc()
            raise
    _publish(memo.context, plain, outcome)
    patch.status.update(outcome.status)
    degraded = next(c for c in outcome.status["conditions"] if c["type"] == "Degraded")
    result = "applied" if degraded["status"] == "False" else degraded["reason"]
    RECONCILES.labels("invalid" if result == "InvalidSpec" else "applied").inc()
    if outcome.retry:
        ERRORS.labels("apply").inc()
        memo.context.api.patch_status(
            plain["metadata"]["namespace"], plain["metadata"]["name"], outcome.status
        )
        raise kopf.TemporaryError(degraded["message"], delay=30)
    logger.info(f"reconciled generation {plain['metadata'].get('generation')}: {result}")


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED_CHILDREN)
def deployment_changed(
    event: Mapping[str, Any], memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Carry a child Deployment's progress into its InferenceService's status."""
    deployment = plain_dict(event["object"])
    context: OperatorContext = memo.context
    if event.get("type") == "DELETED":
        _recreate_if_owner_lives(context, deployment, logger)
        return
    try:
        refreshed = refresh_status(context, deployment, now())
    except kubernetes.client.ApiException:
        ERRORS.labels("status").inc()
        raise
    if refreshed is None:
        return
    parent, outcome = refreshed
    meta = parent["metadata"]
    context.api.patch_status(meta["namespace"], meta["name"], outcome.status)
    _publish(context, parent, outcome)


@kopf.on.event(GROUP, VERSION, PLURAL)
def service_event(event: Mapping[str, Any], **_: Any) -> None:
    """Forget a deleted service's per-object metrics; children go with garbage collection."""
    if event.get("type") == "DELETED":
        meta = event["object"]["metadata"]
        forget_service(meta["namespace"], meta["name"])


@kopf.on.probe(id="reconciles")
def reconcile_count(**_: Any) -> float:
    """Shown on the liveness endpoint: proof the handlers run, not just the HTTP server."""
    return sum(
        sample.value for sample in RECONCILES.collect()[0].samples if sample.name.endswith("_total")
    )


def _recreate_if_owner_lives(
    context: OperatorContext, deployment: Mapping[str, Any], logger: kopf.Logger
) -> None:
    """A Deployment deleted by hand while its service lives is put back, not left missing."""
    for ref in deployment["metadata"].get("ownerReferences") or []:
        parent = (
            context.api.get(
                ref["apiVersion"], ref["kind"], deployment["metadata"]["namespace"], ref["name"]
            )
            if ref.get("kind") == "InferenceService"
            else None
        )
        if parent and parent["metadata"].get("uid") == ref.get("uid"):
            if parent["metadata"].get("deletionTimestamp"):
                return
            logger.warning(f"Deployment of {ref['name']} was deleted; re-applying")
            outcome = reconcile(context, parent, now())
            meta = parent["metadata"]
            context.api.patch_status(meta["namespace"], meta["name"], outcome.status)
            _publish(context, parent, outcome)


def _publish(context: OperatorContext, body: Mapping[str, Any], outcome: Outcome) -> None:
    meta = body["metadata"]
    record_ready(meta["namespace"], meta["name"], outcome.status)
    for note in outcome.events:
        kopf.event(dict(body), type=note.type, reason=note.reason, message=note.message)


def plain_dict(value: Any) -> Any:
    """kopf's body views to plain dicts and lists (what the pure modules take)."""
    if isinstance(value, Mapping):
        return {key: plain_dict(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain_dict(item) for item in value]
    return value


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
