"""The Prometheus Operator ServiceMonitor, for clusters that scrape through it."""

from __future__ import annotations

from typing import Any

from radixserve_operator.manifests.meta import HTTP_PORT_NAME, Owner, object_meta, selector_labels
from radixserve_operator.spec import Monitoring


def build_service_monitor(owner: Owner, monitoring: Monitoring) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": object_meta(owner, component="monitoring"),
        "spec": {
            "selector": {"matchLabels": selector_labels(owner)},
            "namespaceSelector": {"matchNames": [owner.namespace]},
            "endpoints": [
                {"port": HTTP_PORT_NAME, "path": "/metrics", "interval": monitoring.interval}
            ],
        },
    }
