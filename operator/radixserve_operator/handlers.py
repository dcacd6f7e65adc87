"""kopf handlers: thin adapters from kopf's causes to ``reconcile`` and ``refresh_status``.

Registered on import (``kopf run -m radixserve_operator.handlers`` or ``main.run``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import functools
import threading
import time
from collections.abc import Mapping
from typing import Any

import kopf
import kubernetes

from radixserve_operator import API_VERSION, FIELD_MANAGER, GROUP, KIND, PLURAL, VERSION
from radixserve_operator.kube import KubeApi
from radixserve_operator.lora_sync import (
    LORA_SYNC_SECONDS,
    RefusedLoads,
    SyncSchedule,
    WorkerAdapters,
    adapter_status,
    read_admin_key,
    ready_workers,
    serves_adapters,
    sync_workers,
)
from radixserve_operator.manifests.lora import lora_modules
from radixserve_operator.manifests.meta import SERVICE_LABEL
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
    owner_reference,
    reconcile,
    refresh_status,
    refresh_worker_status,
)
from radixserve_operator.spec import InvalidSpecError, ServiceSpec, parse_spec

MANAGED_CHILDREN = {"app.kubernetes.io/managed-by": FIELD_MANAGER}
WORKER_PODS = {**MANAGED_CHILDREN, "app.kubernetes.io/component": "worker"}
# One lock per InferenceService: the reconcile and the Deployment watcher both write its status
# (from kopf's worker threads); serialising them keeps a stale read from overwriting a new one.
_status_locks: collections.defaultdict[tuple[str, str], threading.Lock] = collections.defaultdict(
    threading.Lock
)
SERVICE_KIND = (API_VERSION, KIND)
DEFAULT_WORKER_IMAGE = "ghcr.io/radixserve/radixserve:0.1.0"
DEFAULT_PROMETHEUS_ADDRESS = "http://prometheus-operated.monitoring.svc:9090"


@kopf.on.startup()
def connect(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Build the API client once; config comes from ``main`` (or defaults under ``kopf run``)."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()  # $KUBECONFIG or ~/.kube/config, as kopf's login
    memo.refused_loads = RefusedLoads()
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
    namespace: str, name: str, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Apply the children and write the status; invalid specs end as Degraded, not retries."""
    context: OperatorContext = memo.context
    with RECONCILE_SECONDS.time(), _status_locks[namespace, name]:
        try:
            # Read fresh rather than use kopf's cached body: the Deployment watcher may have
            # written the status since, and a newer spec is simply reconciled a step early.
            current = context.api.get(*SERVICE_KIND, namespace, name)
            if current is None:
                return  # deleted meanwhile; garbage collection takes the children
            outcome = reconcile(context, current, now())
            context.api.patch_status(namespace, name, outcome.status)
        except Exception:
            ERRORS.labels("reconcile").inc()
            RECONCILES.labels("failed").inc()
            raise
    _publish(context, current, outcome)
    degraded = next(c for c in outcome.status["conditions"] if c["type"] == "Degraded")
    result = {"InvalidSpec": "invalid", "ApplyFailed": "failed"}.get(degraded["reason"], "applied")
    RECONCILES.labels(result).inc()
    if outcome.retry:
        ERRORS.labels("apply").inc()
        raise kopf.TemporaryError(degraded["message"], delay=30)
    generation = current["metadata"].get("generation")
    logger.info(f"reconciled generation {generation}: {degraded['reason']}")


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
    owner = _owner_name(deployment)
    if owner is None:
        return
    with _status_locks[owner]:
        try:
            refreshed = refresh_status(context, deployment, now())
            if refreshed is not None:
                context.api.patch_status(*owner, refreshed[1].status)
        except kubernetes.client.ApiException:
            ERRORS.labels("status").inc()
            raise
    if refreshed is not None:
        _publish(context, *refreshed)


@kopf.on.event("", "v1", "pods", labels={**WORKER_PODS, SERVICE_LABEL: kopf.PRESENT})
def worker_pod_changed(event: Mapping[str, Any], memo: kopf.Memo, **_: Any) -> None:
    """Show a worker that cannot start (crash loop, OOM kill, no node fits) as Degraded, with
    its last termination message and an Event, and clear it when the pods recover."""
    pod = event["object"]
    namespace = pod["metadata"]["namespace"]
    service_name = pod["metadata"]["labels"][SERVICE_LABEL]
    context: OperatorContext = memo.context
    with _status_locks[namespace, service_name]:
        try:
            pods = context.api.list_pods(namespace, worker_selector(service_name))
            refreshed = refresh_worker_status(context, namespace, service_name, pods, now())
            if refreshed is not None:
                context.api.patch_status(namespace, service_name, refreshed[1].status)
        except kubernetes.client.ApiException:
            ERRORS.labels("status").inc()
            raise
    if refreshed is not None:
        _publish(context, *refreshed)


@kopf.on.startup()
async def start_adapter_sync(memo: kopf.Memo, **_: Any) -> None:
    """Start the rounds that bring running workers to spec.loras (``lora_sync``)."""
    memo.adapter_sync = SyncSchedule(functools.partial(sync_adapters, memo))
    memo.adapter_sync_loop = asyncio.create_task(memo.adapter_sync.run(LORA_SYNC_SECONDS))


@kopf.on.cleanup()
async def stop_adapter_sync(memo: kopf.Memo, **_: Any) -> None:
    memo.adapter_sync_loop.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await memo.adapter_sync_loop
    await memo.adapter_sync.close()


async def sync_adapters(memo: kopf.Memo, namespace: str, name: str) -> None:
    """One round for one service: spec.loras onto its ready workers through their admin
    endpoints (read at once, or only registered on onDemand's lazy workers), then the
    per-adapter status. The Kubernetes calls run in threads
    and the pods are called with timeouts, so a slow service holds up only its own rounds."""
    context: OperatorContext = memo.context
    body = await asyncio.to_thread(context.api.get, *SERVICE_KIND, namespace, name)
    if body is None:
        return
    try:
        spec = parse_spec(body.get("spec") or {}, name=name, default_image="")
    except InvalidSpecError:
        return  # the reconcile reports it; the pods keep what they have
    workers: list[WorkerAdapters] = []
    if spec.lora.enabled:
        pods = await asyncio.to_thread(context.api.list_pods, namespace, worker_selector(name))
        key = await asyncio.to_thread(read_admin_key, context.api, namespace, spec)
        wanted = lora_modules(spec.lora.adapters)
        workers = await sync_workers(
            ready_workers(pods),
            key,
            wanted,
            memo.refused_loads,
            time.monotonic(),
            lazy=spec.lora.on_demand,
        )
    events = await asyncio.to_thread(_patch_adapter_status, context, namespace, name, spec, workers)
    for kind, reason, message in events:
        kopf.event(body, type=kind, reason=reason, message=message)


def _patch_adapter_status(
    context: OperatorContext,
    namespace: str,
    name: str,
    spec: ServiceSpec,
    workers: list[WorkerAdapters],
) -> list[tuple[str, str, str]]:
    """Write status.loras and LoraLoadFailed under the service's status lock (the reconcile
    and the watchers write the same status); nothing when nothing changed."""
    with _status_locks[namespace, name]:
        current = context.api.get(*SERVICE_KIND, namespace, name)
        if current is None:
            return []
        previous = current.get("status") or {}
        status, events = adapter_status(previous, spec, workers, now())
        if status["loras"] != (previous.get("loras") or []) or _without_times(
            status["conditions"]
        ) != _without_times(previous.get("conditions")):
            context.api.patch_status(namespace, name, status)
    return events


def _without_times(conditions: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in conditions or []]


def worker_selector(service_name: str) -> str:
    """The label selector of one service's worker pods."""
    labels = {**WORKER_PODS, SERVICE_LABEL: service_name}
    return ",".join(f"{key}={value}" for key, value in labels.items())


@kopf.on.event(GROUP, VERSION, PLURAL)
async def service_event(event: Mapping[str, Any], memo: kopf.Memo, **_: Any) -> None:
    """Forget a deleted service's per-object metrics (children go with garbage collection);
    tell the adapter sync of every service with adapters and of each spec change."""
    body = event["object"]
    meta = body["metadata"]
    if event.get("type") == "DELETED":
        forget_service(meta["namespace"], meta["name"])
        _status_locks.pop((meta["namespace"], meta["name"]), None)
        memo.adapter_sync.forget(meta["namespace"], meta["name"])
        return
    memo.adapter_sync.track(
        meta["namespace"], meta["name"], meta.get("generation"), serves_adapters(body)
    )


@kopf.on.probe(id="reconciles")
def reconcile_count(**_: Any) -> float:
    """Shown on the liveness endpoint: proof the handlers run, not just the HTTP server."""
    return sum(
        sample.value for sample in RECONCILES.collect()[0].samples if sample.name.endswith("_total")
    )


def _owner_name(deployment: Mapping[str, Any]) -> tuple[str, str] | None:
    ref = owner_reference(deployment)
    return None if ref is None else (deployment["metadata"]["namespace"], ref["name"])


def _recreate_if_owner_lives(
    context: OperatorContext, deployment: Mapping[str, Any], logger: kopf.Logger
) -> None:
    """A Deployment deleted by hand while its service lives is put back, not left missing."""
    owner = _owner_name(deployment)
    if owner is None:
        return
    with _status_locks[owner]:
        parent = context.api.get(*SERVICE_KIND, *owner)
        if parent is None or parent["metadata"].get("deletionTimestamp"):
            return  # deleted with its owner: garbage collection at work
        logger.warning(f"the Deployment of {owner[1]} was deleted; applying it again")
        outcome = reconcile(context, parent, now())
        context.api.patch_status(*owner, outcome.status)
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
