"""The Service in front of the worker pods (port ``http``, 8000)."""

from __future__ import annotations

from typing import Any

from radixserve_operator.manifests.meta import HTTP_PORT_NAME, Owner, object_meta, selector_labels
from radixserve_operator.spec import DEFAULT_PORT


def build_service(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(owner),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner),
            "ports": [
                {
                    "name": HTTP_PORT_NAME,
                    "port": DEFAULT_PORT,
                    "targetPort": HTTP_PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }
