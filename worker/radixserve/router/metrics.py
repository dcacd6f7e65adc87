"""The router's Prometheus series (prefix `radixserve_router_`, label `model_name` as the worker's).

`radixserve_router_pending_requests` is the one an autoscaler reads to wake a service scaled to
zero: requests held because no worker is ready. Each `RouterMetrics` has its own registry, so
several routers in one process (tests) do not collide.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

disable_created_metrics()

PREFIX = "radixserve_router_"
WORKER_STATES = ("ready", "not_ready", "down")
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 320.0,
)  # fmt: skip
METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST


class RouterMetrics:
    def __init__(self, model_name: str = "") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        reg = self.registry
        self._requests = Counter(
            PREFIX + "requests",
            "Requests sent to a worker, by worker and the policy decision that chose it",
            ["model_name", "worker", "decision"],
            registry=reg,
        )
        self._upstream_errors = Counter(
            PREFIX + "upstream_errors",
            "Failed attempts at a worker: connect, status_429, status_503, disconnected (after"
            " the request was sent), stream_broken",
            ["model_name", "worker", "kind"],
            registry=reg,
        )
        self.retries = Counter(
            PREFIX + "retries", "Attempts repeated on another worker", ["model_name"], registry=reg
        ).labels(model_name)
        self.quarantined = Counter(
            PREFIX + "quarantined_requests",
            "Requests refused unsent because identical ones coincided with two worker failures",
            ["model_name"],
            registry=reg,
        ).labels(model_name)
        self.pending_requests = Gauge(
            PREFIX + "pending_requests",
            "Requests waiting for a ready worker",
            ["model_name"],
            registry=reg,
        ).labels(model_name)
        self._workers = Gauge(
            PREFIX + "workers", "Known workers by state", ["model_name", "state"], registry=reg
        )
        for state in WORKER_STATES:
            self._workers.labels(model_name, state).set(0)
        self.request_latency = Histogram(
            PREFIX + "request_latency_seconds",
            "From a request's arrival at the router to the last byte of its response",
            ["model_name"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        ).labels(model_name)

    def routed(self, worker: str, decision: str) -> None:
        self._requests.labels(self.model_name, worker, decision).inc()

    def upstream_error(self, worker: str, kind: str) -> None:
        self._upstream_errors.labels(self.model_name, worker, kind).inc()

    def set_worker_counts(self, counts: dict[str, int]) -> None:
        for state in WORKER_STATES:
            self._workers.labels(self.model_name, state).set(counts.get(state, 0))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
