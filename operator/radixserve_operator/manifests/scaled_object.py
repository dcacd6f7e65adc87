"""The KEDA ScaledObject: Prometheus triggers on worker load, scaling the InferenceService.

KEDA's HPA writes the InferenceService's ``/scale`` subresource (``spec.replicas``); the operator
then carries that count to the Deployment. Scaling the Deployment directly would make the
operator and the HPA fight over ``Deployment.spec.replicas``.
"""

from __future__ import annotations

from typing import Any

from radixserve_operator import API_VERSION, KIND
from radixserve_operator.manifests.meta import Owner, object_meta
from radixserve_operator.spec import Autoscaling

METRIC_NAMES = {
    "queued": "radixserve_num_queued_requests",
    "running": "radixserve_num_running_requests",
    "kvCacheUsage": "radixserve_kv_cache_usage_ratio",
}


def prometheus_query(owner: Owner, metric: str) -> str:
    """Sum of the metric over this service's pods.

    KEDA's default AverageValue divides the sum by the replica count, so the target reads as
    "per replica" for counts and as the mean ratio for ``kvCacheUsage``. Pod names are
    ``<deployment>-<hash>-<suffix>``; the anchored regex keeps ``svc-a`` from matching
    ``svc-a-b``'s pods.
    """
    pods = f"{owner.name}-[a-z0-9]+-[a-z0-9]+"
    return f'sum({METRIC_NAMES[metric]}{{namespace="{owner.namespace}",pod=~"{pods}"}})'


def build_scaled_object(
    owner: Owner, autoscaling: Autoscaling, prometheus_address: str
) -> dict[str, Any]:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": object_meta(owner, component="autoscaler"),
        "spec": {
            "scaleTargetRef": {"apiVersion": API_VERSION, "kind": KIND, "name": owner.name},
            "minReplicaCount": autoscaling.min_replicas,
            "maxReplicaCount": autoscaling.max_replicas,
            "pollingInterval": autoscaling.polling_interval_seconds,
            "cooldownPeriod": autoscaling.cooldown_seconds,
            "triggers": [
                {
                    "type": "prometheus",
                    "metricType": "AverageValue",
                    "metadata": {
                        "serverAddress": prometheus_address,
                        "query": prometheus_query(owner, autoscaling.metric),
                        "threshold": f"{autoscaling.target:g}",
                    },
                }
            ],
        },
    }
