"""The service's Service (port ``http``, 8000): in front of the workers, or of the router."""

from __future__ import annotations

from typing import Any

from radixserve_operator.manifests.meta import (
    HTTP_PORT_NAME,
    Owner,
    object_meta,
    selector_labels,
    service_ports,
)
from radixserve_operator.manifests.router import ROUTER_COMPONENT, router_selector_labels
from radixserve_operator.spec import DEFAULT_PORT, KVEvents


def build_service(
    owner: Owner, *, router: bool = False, kv_events: KVEvents | None = None
) -> dict[str, Any]:
    """With the router on, the same name and port lead to the router pods instead (the
    workers' KV events port is then on the headless NAME-workers)."""
    if not router:
        ports = service_ports(kv_events)
    else:
        ports = [
            {
                "name": HTTP_PORT_NAME,
                "port": DEFAULT_PORT,
                "targetPort": HTTP_PORT_NAME,
                "protocol": "TCP",
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(owner, component=ROUTER_COMPONENT if router else "worker"),
        "spec": {
            "type": "ClusterIP",
            "selector": router_selector_labels(owner) if router else selector_labels(owner),
            "ports": ports,
        },
    }
