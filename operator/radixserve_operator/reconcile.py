"""One reconcile pass and the status refreshes, independent of kopf.

``reconcile`` turns an InferenceService body into applied children and a status;
``refresh_status`` recomputes a parent's status when its Deployment changes and
``refresh_worker_status`` when one of its worker pods does. All return what to patch and which
Events to post, and let the kopf handlers do the posting.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from radixserve_operator import API_VERSION, FIELD_MANAGER, KIND
from radixserve_operator.kube import KubeApi
from radixserve_operator.manifests import (
    Owner,
    build_children,
    lora_config_map_name,
    selector_string,
    service_url,
)
from radixserve_operator.manifests.router import router_child_keys, router_name
from radixserve_operator.spec import DEFAULT_PORT, InvalidSpecError, ServiceSpec, parse_spec
from radixserve_operator.status import (
    DEGRADED,
    READY,
    WORKER_PROBLEMS,
    DeploymentState,
    Problem,
    compute_status,
    problem_from_status,
    worker_problem,
)

OPTIONAL_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "autoscaling",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring",
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencePool",
}


@dataclass(frozen=True)
class EventNote:
    """A Kubernetes Event to post on the InferenceService."""

    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Outcome:
    status: dict[str, Any]
    events: list[EventNote] = field(default_factory=list)
    retry: bool = False  # a transient failure: kopf should run the handler again


@dataclass(frozen=True)
class OperatorContext:
    api: KubeApi
    default_image: str
    prometheus_address: str


def owner_of(body: Mapping[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])


def owner_reference(child: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The child's InferenceService owner reference, if it has one."""
    for ref in child["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion") == API_VERSION:
            return ref
    return None


def reconcile(ctx: OperatorContext, body: Mapping[str, Any], now: str) -> Outcome:
    owner = owner_of(body)
    generation = body["metadata"].get("generation")
    previous = body.get("status") or {}
    workers = problem_from_status(previous, WORKER_PROBLEMS)  # the pod watcher's to change
    try:
        spec = parse_spec(body.get("spec") or {}, name=owner.name, default_image=ctx.default_image)
    except InvalidSpecError as error:
        existing = ctx.api.get("apps/v1", "Deployment", owner.namespace, owner.name)
        problem = Problem("InvalidSpec", str(error))
        # the children of the last valid spec still run, the router among them
        status = _status(
            owner,
            generation,
            existing,
            problem,
            previous,
            now,
            url=None,
            workers=workers,
            router=_router_of(ctx.api, owner),
        )
        events = _transitions(previous, status)
        if not events and previous.get("observedGeneration") != generation:
            events.append(EventNote("Warning", "InvalidSpec", str(error)))  # each refused edit
        return Outcome(status, events)

    problem: Problem | None = None
    deployment: dict[str, Any] | None = None
    router: dict[str, Any] | None = None
    retry = False
    for manifest in build_children(owner, spec, prometheus_address=ctx.prometheus_address):
        manifest = _respect_foreign_replicas(ctx.api, manifest)
        try:
            applied = ctx.api.apply(manifest)
        except ApiException as error:
            key = (manifest["apiVersion"], manifest["kind"])
            if error.status == 404 and key in OPTIONAL_KINDS:
                problem = problem or _missing_kind_problem(key)
                continue
            problem = Problem("ApplyFailed", f"{manifest['kind']}: {error.status} {error.reason}")
            retry = error.status in (0, 409, 429) or error.status >= 500
            break
        if manifest["kind"] == "Deployment" and manifest["metadata"]["name"] == owner.name:
            deployment = applied
        elif manifest["kind"] == "Deployment":
            router = applied
    _prune_unwanted(ctx.api, owner, spec)
    if deployment is None:
        deployment = ctx.api.get("apps/v1", "Deployment", owner.namespace, owner.name)
    if router is None and spec.router.enabled:
        router = _router_of(ctx.api, owner)
        router = router or {"spec": {"replicas": spec.router.replicas}}  # not there yet
    url = service_url(owner, DEFAULT_PORT)
    status = _status(
        owner,
        generation,
        deployment,
        problem,
        previous,
        now,
        url=url,
        workers=workers,
        router=router,
    )
    events = _transitions(previous, status)
    if previous.get("observedGeneration") != generation and problem is None:
        events.insert(0, EventNote("Normal", "Reconciled", f"applied generation {generation}"))
    return Outcome(status, events, retry=retry)


def refresh_status(
    ctx: OperatorContext, deployment: Mapping[str, Any], now: str
) -> tuple[Mapping[str, Any], Outcome] | None:
    """The owner's new status after one of its Deployments changed; ``None`` if nothing to
    change. The event's ``deployment`` only names the owner: both Deployments are read fresh,
    because a handler that waited for the status lock may carry an older copy than the one
    the previous handler already reported."""
    owner_ref = owner_reference(deployment)
    if owner_ref is None:
        return None
    namespace = deployment["metadata"]["namespace"]
    parent = ctx.api.get(API_VERSION, KIND, namespace, owner_ref["name"])
    if parent is None or parent["metadata"].get("uid") != owner_ref.get("uid"):
        return None
    previous = parent.get("status") or {}
    owner = owner_of(parent)
    workers = ctx.api.get("apps/v1", "Deployment", namespace, owner.name)
    problem = problem_from_status(previous, WORKER_PROBLEMS)
    return _refreshed(parent, workers, _router_of(ctx.api, owner), problem, now)


def refresh_worker_status(
    ctx: OperatorContext,
    namespace: str,
    service_name: str,
    pods: list[Mapping[str, Any]],
    now: str,
) -> tuple[Mapping[str, Any], Outcome] | None:
    """The service's new status from all of its worker ``pods`` (after one of them changed):
    Degraded while they cannot start, and back when they can; ``None`` if nothing to change."""
    parent = ctx.api.get(API_VERSION, KIND, namespace, service_name)
    if parent is None or parent["metadata"].get("deletionTimestamp"):
        return None
    deployment = ctx.api.get("apps/v1", "Deployment", namespace, service_name)
    router = _router_of(ctx.api, owner_of(parent))
    return _refreshed(parent, deployment, router, worker_problem(pods), now)


def _router_of(api: KubeApi, owner: Owner) -> Mapping[str, Any] | None:
    """The service's router Deployment: there only while the spec enables it (else pruned)."""
    router = api.get("apps/v1", "Deployment", owner.namespace, router_name(owner))
    owned = router is not None and (owner_reference(router) or {}).get("uid") == owner.uid
    return router if owned else None


def _refreshed(
    parent: Mapping[str, Any],
    deployment: Mapping[str, Any] | None,
    router: Mapping[str, Any] | None,
    workers: Problem | None,
    now: str,
) -> tuple[Mapping[str, Any], Outcome] | None:
    """The parent's status recomputed between reconciles (its reconcile problem kept)."""
    previous = parent.get("status") or {}
    status = _status(
        owner_of(parent),
        previous.get("observedGeneration"),
        deployment,
        problem_from_status(previous),
        previous,
        now,
        url=previous.get("url"),
        workers=workers,
        router=router,
    )
    if _comparable(status) == _comparable({key: previous.get(key) for key in status}):
        return None
    return parent, Outcome(status, _transitions(previous, status))


def _status(
    owner: Owner,
    generation: int | None,
    deployment: Mapping[str, Any] | None,
    problem: Problem | None,
    previous: Mapping[str, Any],
    now: str,
    *,
    url: str | None,
    workers: Problem | None = None,
    router: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return compute_status(
        observed_generation=generation,
        deployment=DeploymentState.from_body(deployment) if deployment else None,
        problem=problem,
        selector=selector_string(owner),
        url=url,
        previous=previous,
        now=now,
        workers=workers,
        router=DeploymentState.from_body(router) if router is not None else None,
    )


def _respect_foreign_replicas(api: KubeApi, manifest: dict[str, Any]) -> dict[str, Any]:
    """Leave ``replicas`` out when another manager (an HPA on the Deployment) owns it."""
    if manifest["kind"] != "Deployment":
        return manifest
    meta = manifest["metadata"]
    existing = api.get("apps/v1", "Deployment", meta["namespace"], meta["name"])
    if existing is None or not replicas_owned_by_other_manager(existing):
        return manifest
    trimmed = copy.deepcopy(manifest)
    del trimmed["spec"]["replicas"]
    return trimmed


def replicas_owned_by_other_manager(deployment: Mapping[str, Any]) -> bool:
    for entry in deployment.get("metadata", {}).get("managedFields") or []:
        owned = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if "f:replicas" in owned and entry.get("manager") != FIELD_MANAGER:
            return True
    return False


def _prune_unwanted(api: KubeApi, owner: Owner, spec: ServiceSpec) -> None:
    """Delete the optional children the spec no longer asks for (only the ones we own)."""
    wanted = {
        "autoscaling": spec.autoscaling is not None,
        "monitoring": spec.monitoring.service_monitor,
        "inferencePool": spec.router.inference_pool,
    }
    unwanted = [
        (api_version, kind, owner.name)
        for (api_version, kind), feature in OPTIONAL_KINDS.items()
        if not wanted[feature]
    ]
    if not spec.router.enabled:
        unwanted += router_child_keys(owner)
    if not spec.lora.enabled:
        unwanted.append(("v1", "ConfigMap", lora_config_map_name(owner)))
    for api_version, kind, name in unwanted:
        try:
            existing = api.get(api_version, kind, owner.namespace, name)
        except ApiException:
            continue  # the kind is not served at all: nothing of ours to prune
        refs = (existing or {}).get("metadata", {}).get("ownerReferences") or []
        if any(ref.get("uid") == owner.uid for ref in refs):
            api.delete(api_version, kind, owner.namespace, name)


def _missing_kind_problem(key: tuple[str, str]) -> Problem | None:
    if OPTIONAL_KINDS[key] == "autoscaling":
        return Problem(
            "AutoscalingUnavailable",
            "spec.autoscaling needs KEDA (keda.sh/v1alpha1 ScaledObject), which is not installed",
        )
    if OPTIONAL_KINDS[key] == "inferencePool":
        return Problem(
            "InferencePoolUnavailable",
            "spec.router.inferencePool needs the Gateway API Inference Extension's CRDs"
            " (inference.networking.k8s.io/v1 InferencePool), which are not installed",
        )
    return None  # a missing ServiceMonitor CRD only loses the scrape config; pods keep annotations


def _transitions(previous: Mapping[str, Any], status: Mapping[str, Any]) -> list[EventNote]:
    """Events for the condition flips worth a human's attention."""
    before = {c.get("type"): c for c in previous.get("conditions") or []}
    notes: list[EventNote] = []
    for condition in status["conditions"]:
        old = before.get(condition["type"], {})
        changed = (old.get("status"), old.get("reason")) != (
            condition["status"],
            condition["reason"],
        )
        if not changed:
            continue
        if condition["type"] == READY and condition["status"] == "True":
            notes.append(EventNote("Normal", "Ready", condition["message"]))
        elif condition["type"] == READY and old.get("status") == "True":
            notes.append(EventNote("Warning", "NotReady", condition["message"]))
        elif condition["type"] == DEGRADED and condition["status"] == "True":
            notes.append(EventNote("Warning", condition["reason"], condition["message"]))
        elif condition["type"] == DEGRADED and old.get("status") == "True":
            notes.append(EventNote("Normal", "Recovered", "no longer degraded"))
    return notes


def _comparable(status: Mapping[str, Any]) -> Any:
    """A status without timestamps, to tell whether a patch would change anything."""
    conditions = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"}
        for c in status.get("conditions") or []
    ]
    return {**{k: v for k, v in status.items() if k != "conditions"}, "conditions": conditions}
