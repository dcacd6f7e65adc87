"""The router of a service (`spec.router`): its pods, its identity, and the workers' headless Service.

With the router on, the service's Service (`NAME`) selects the router pods, the router finds
the workers through the EndpointSlices of a headless Service (`NAME-workers`), and its
ServiceAccount may read EndpointSlices in the service's namespace and nothing else. Router pods
carry `app.kubernetes.io/name: radixserve-router`, so the workers' immutable selector
(`app.kubernetes.io/name: radixserve`, ...) never matches them.

The router pod's readiness probe is `/health`, not `/ready`: a router with no ready worker
must stay in its Service to take and hold requests; that is how a service scaled to zero
wakes up (the held requests are `radixserve_router_pending_requests`, KEDA's trigger).
"""

from __future__ import annotations

from typing import Any

from radixserve_operator import FIELD_MANAGER
from radixserve_operator.manifests.meta import (
    APP_NAME,
    HTTP_PORT_NAME,
    SERVICE_LABEL,
    Owner,
    cli_flags,
    object_meta,
    selector_labels,
    service_ports,
)
from radixserve_operator.manifests.workload import GRACE_MARGIN_SECONDS, WORKER_UID, http_probe
from radixserve_operator.spec import DEFAULT_PORT, KVEvents, ServiceSpec

ROUTER_APP_NAME = "radixserve-router"
ROUTER_COMPONENT = "router"
PRE_STOP_SLEEP_SECONDS = 5  # endpoints drop the pod before the router stops listening
ENDPOINT_SLICE_RULE = {
    "apiGroups": ["discovery.k8s.io"],
    "resources": ["endpointslices"],
    "verbs": ["get", "list", "watch"],
}
# The Gateway API Inference Extension's endpoint picker, as its chart names and serves it.
ENDPOINT_PICKER_PORT = 9002


def router_name(owner: Owner) -> str:
    return f"{owner.name}-router"


def workers_service_name(owner: Owner) -> str:
    return f"{owner.name}-workers"


def router_selector_labels(owner: Owner) -> dict[str, str]:
    return {"app.kubernetes.io/name": ROUTER_APP_NAME, SERVICE_LABEL: owner.name}


def router_pod_labels(owner: Owner) -> dict[str, str]:
    return {
        **router_selector_labels(owner),
        "app.kubernetes.io/instance": owner.name,
        "app.kubernetes.io/component": ROUTER_COMPONENT,
        "app.kubernetes.io/part-of": APP_NAME,
        "app.kubernetes.io/managed-by": FIELD_MANAGER,
    }


def router_args(owner: Owner, spec: ServiceSpec) -> list[str]:
    """The `radixserve router` command line (the router's CLI contract), its values joined to
    their flags (``cli_flags``)."""
    valued: list[tuple[str, object]] = [
        ("--host", "0.0.0.0"),
        ("--port", DEFAULT_PORT),
        ("--policy", spec.router.policy),
        ("--discover-selector", f"kubernetes.io/service-name={workers_service_name(owner)}"),
        ("--namespace", owner.namespace),
        ("--discover-port", HTTP_PORT_NAME),
        ("--model-name", spec.model.served_name),
        ("--pending-timeout", spec.router.pending_timeout_seconds),
        ("--drain-timeout", spec.lifecycle.drain_timeout_seconds),
    ]
    events = spec.engine.kv_events
    if events is not None and spec.router.policy == "cache_aware":
        # route on what the workers' KV events say they hold
        valued += [
            ("--prefix-source", "events"),
            ("--kv-events-port", events.port),
            ("--kv-events-replay-port", events.replay_port),
            ("--kv-events-block-size", events.block_size),
        ]
    return ["router", *cli_flags(valued)]


def build_router_children(owner: Owner, spec: ServiceSpec) -> list[dict[str, Any]]:
    """Identity first, then the workers' Service, the budget, and the Deployment last."""
    return [
        _service_account(owner),
        _role(owner),
        _role_binding(owner),
        build_workers_service(owner, spec.engine.kv_events),
        _disruption_budget(owner),
        build_router_deployment(owner, spec),
    ]


def router_child_keys(owner: Owner) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of every child `build_router_children` makes, for pruning."""
    name = router_name(owner)
    return [
        ("v1", "ServiceAccount", name),
        ("rbac.authorization.k8s.io/v1", "Role", name),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", name),
        ("v1", "Service", workers_service_name(owner)),
        ("policy/v1", "PodDisruptionBudget", name),
        ("apps/v1", "Deployment", name),
    ]


def _meta(owner: Owner, name: str, component: str = ROUTER_COMPONENT) -> dict[str, Any]:
    return object_meta(owner, name=name, component=component)


def _service_account(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(owner, router_name(owner)),
    }


def _role(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(owner, router_name(owner)),
        "rules": [ENDPOINT_SLICE_RULE],
    }


def _role_binding(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(owner, router_name(owner)),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": router_name(owner),
        },
        "subjects": [
            {"kind": "ServiceAccount", "name": router_name(owner), "namespace": owner.namespace}
        ],
    }


def build_workers_service(owner: Owner, kv_events: KVEvents | None = None) -> dict[str, Any]:
    """Headless: its EndpointSlices list each worker pod, which is what the router reads (and
    each pod's KV events port, when enabled)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(owner, workers_service_name(owner), component="worker"),
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(owner),
            "ports": service_ports(kv_events),
        },
    }


def _disruption_budget(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(owner, router_name(owner)),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": router_selector_labels(owner)},
        },
    }


def build_router_deployment(owner: Owner, spec: ServiceSpec) -> dict[str, Any]:
    drain = spec.lifecycle.drain_timeout_seconds
    container = {
        "name": "router",
        "image": spec.image,
        "command": ["radixserve"],
        "args": router_args(owner, spec),
        "ports": [{"name": HTTP_PORT_NAME, "containerPort": DEFAULT_PORT, "protocol": "TCP"}],
        "livenessProbe": http_probe("/health", period=10, failures=3),
        "readinessProbe": http_probe("/health", period=5, failures=2),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_SLEEP_SECONDS)]}}},
        "resources": {
            "requests": {"cpu": "250m", "memory": "256Mi"},
            "limits": {"memory": "1Gi"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(owner, router_name(owner)),
        "spec": {
            "replicas": spec.router.replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": router_selector_labels(owner)},
            # Routers are small and CPU-only: surge a new one before an old one goes.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {
                "metadata": {
                    "labels": router_pod_labels(owner),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(DEFAULT_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "serviceAccountName": router_name(owner),
                    "automountServiceAccountToken": True,  # it lists EndpointSlices
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": PRE_STOP_SLEEP_SECONDS
                    + drain
                    + GRACE_MARGIN_SECONDS,
                    "securityContext": {  # the restricted Pod Security Standard, as workers
                        "runAsNonRoot": True,
                        "runAsUser": WORKER_UID,
                        "runAsGroup": WORKER_UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                },
            },
        },
    }


def build_inference_pool(owner: Owner) -> dict[str, Any]:
    """The Gateway API Inference Extension's pool of worker pods, for its endpoint picker.

    The picker is the upstream one, deployed by the user as NAME-epp (its chart's naming)
    with the flags that read radixserve's metric names (docs/operations.md).
    """
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": _meta(owner, owner.name, component="worker"),
        "spec": {
            "selector": {"matchLabels": selector_labels(owner)},
            "targetPorts": [{"number": DEFAULT_PORT}],
            "endpointPickerRef": {
                "name": f"{owner.name}-epp",
                "port": {"number": ENDPOINT_PICKER_PORT},
                "failureMode": "FailClose",
            },
        },
    }
