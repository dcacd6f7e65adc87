"""The KEDA ScaledObject: Prometheus triggers on worker load, scaling the InferenceService.

KEDA's HPA writes the InferenceService's ``/scale`` subresource (``spec.replicas``); the operator
then carries that count to the Deployment. Scaling the Deployment directly would make the
operator and the HPA fight over ``Deployment.spec.replicas``.

With the router on, a second trigger reads the requests the routers hold for want of a ready
worker (``radixserve_router_pending_requests``). With no worker pod there is no worker metric
at all; this one is what wakes a service scaled to zero: KEDA activates a scaler whose value
is above ``activationThreshold``, so one held request is enough.
"""

from __future__ import annotations

from typing import Any

from radixserve_operator import API_VERSION, KIND
from radixserve_operator.manifests.meta import Owner, object_meta
from radixserve_operator.manifests.router import router_name
from radixserve_operator.spec import DEFAULT_AUTOSCALING_TARGETS, Autoscaling

METRIC_NAMES = {
    "queued": "radixserve_num_queued_requests",
    "running": "radixserve_num_running_requests",
    "kvCacheUsage": "radixserve_kv_cache_usage_ratio",
}
PENDING_METRIC = "radixserve_router_pending_requests"
PENDING_ACTIVATION_THRESHOLD = "0.5"  # active above it: at 1 held request or more


def prometheus_query(owner: Owner, metric: str) -> str:
    """Sum of the metric over this service's pods.

    KEDA's default AverageValue divides the sum by the replica count, so the target reads as
    "per replica" for counts and as the mean ratio for ``kvCacheUsage``. Pod names are
    ``<deployment>-<hash>-<suffix>``; the anchored regex keeps ``svc-a`` from matching
    ``svc-a-b``'s pods.
    """
    return _pod_sum(METRIC_NAMES[metric], owner.namespace, owner.name)


def pending_query(owner: Owner) -> str:
    """Requests held by this service's routers (pods ``<name>-router-<hash>-<suffix>``)."""
    return _pod_sum(PENDING_METRIC, owner.namespace, router_name(owner))


def _pod_sum(metric: str, namespace: str, deployment: str) -> str:
    pods = f"{deployment}-[a-z0-9]+-[a-z0-9]+"
    return f'sum({metric}{{namespace="{namespace}",pod=~"{pods}"}})'


def pending_trigger(owner: Owner, autoscaling: Autoscaling, prometheus_address: str) -> dict:
    """Held requests count as queued ones (the same per-replica target); one activates."""
    target = (
        autoscaling.target
        if autoscaling.metric == "queued"
        else DEFAULT_AUTOSCALING_TARGETS["queued"]
    )
    return {
        "type": "prometheus",
        "name": "router-pending",
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": prometheus_address,
            "query": pending_query(owner),
            "threshold": f"{target:g}",
            "activationThreshold": PENDING_ACTIVATION_THRESHOLD,
        },
    }


def build_scaled_object(
    owner: Owner, autoscaling: Autoscaling, prometheus_address: str, *, router: bool = False
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
                },
                *([pending_trigger(owner, autoscaling, prometheus_address)] if router else []),
            ],
        },
    }
