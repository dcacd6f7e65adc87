"""Pure builders: an InferenceService spec in, Kubernetes manifests (plain dicts) out."""

from __future__ import annotations

from typing import Any

from radixserve_operator.manifests.disruption_budget import build_disruption_budget
from radixserve_operator.manifests.lora import build_lora_config_map, lora_config_map_name
from radixserve_operator.manifests.meta import Owner, selector_string, service_url
from radixserve_operator.manifests.router import build_inference_pool, build_router_children
from radixserve_operator.manifests.scaled_object import build_scaled_object
from radixserve_operator.manifests.service import build_service
from radixserve_operator.manifests.service_monitor import build_service_monitor
from radixserve_operator.manifests.workload import build_deployment, worker_args
from radixserve_operator.spec import ServiceSpec

__all__ = [
    "Owner",
    "build_children",
    "build_deployment",
    "build_disruption_budget",
    "build_lora_config_map",
    "build_scaled_object",
    "build_service",
    "build_service_monitor",
    "lora_config_map_name",
    "selector_string",
    "service_url",
    "worker_args",
]


def build_children(
    owner: Owner, spec: ServiceSpec, *, prometheus_address: str
) -> list[dict[str, Any]]:
    """Every child the spec asks for, in apply order (the Deployment last, once it can be reached)."""
    router = spec.router.enabled
    children = [
        build_service(owner, router=router, kv_events=spec.engine.kv_events),
        build_disruption_budget(owner),
    ]
    if router:
        children += build_router_children(owner, spec)
    if spec.router.inference_pool:
        children.append(build_inference_pool(owner))
    if spec.autoscaling is not None:
        children.append(
            build_scaled_object(owner, spec.autoscaling, prometheus_address, router=router)
        )
    if spec.monitoring.service_monitor:
        children.append(build_service_monitor(owner, spec.monitoring))
    if spec.lora.enabled:
        # before the Deployment: its pods mount it
        children.append(build_lora_config_map(owner, spec.lora.adapters))
    children.append(build_deployment(owner, spec))
    return children
