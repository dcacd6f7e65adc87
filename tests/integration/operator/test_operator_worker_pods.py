"""The real operator against an emulated API server: a worker that cannot start is Degraded.

The test plays the ReplicaSet controller (it creates a worker pod with the template's labels)
and the kubelet or scheduler (it writes the pod's status): a crash loop, an OOM kill and an
unschedulable pod each turn the InferenceService Degraded=True with that reason, the last
termination message and a Warning Event; a pod that recovers turns it back, with an Event.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from operator_harness import ApiServer, OperatorThread, load_example, operator_config, wait_for

from radixserve_operator import GROUP, PLURAL, VERSION

NS = "default"
LOG_TAIL = "RuntimeError: not enough memory for the KV cache"


def worker_status(**fields: Any) -> dict[str, Any]:
    """The worker container's status (image fields as the kubelet writes them)."""
    return {"name": "worker", "image": "radixserve:test", "imageID": "", **fields}


RUNNING = {
    "phase": "Running",
    "conditions": [{"type": "PodScheduled", "status": "True"}],
    "containerStatuses": [worker_status(ready=True, restartCount=3, state={"running": {}})],
}


def crash_looping(restarts: int, last_termination: dict[str, Any]) -> dict[str, Any]:
    """A worker the kubelet keeps restarting, with how its last run ended."""
    return {
        "phase": "Running",
        "containerStatuses": [
            worker_status(
                ready=False,
                restartCount=restarts,
                state={"waiting": {"reason": "CrashLoopBackOff"}},
                lastState={"terminated": last_termination},
            )
        ],
    }


BROKEN: dict[str, tuple[dict[str, Any], str]] = {
    "CrashLoopBackOff": (
        crash_looping(3, {"reason": "Error", "exitCode": 1, "message": LOG_TAIL}),
        LOG_TAIL,
    ),
    "OOMKilled": (crash_looping(1, {"reason": "OOMKilled", "exitCode": 137}), "OOM-killed"),
    "Unschedulable": (
        {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
                }
            ],
        },
        "Insufficient nvidia.com/gpu",
    ),
}


@pytest.fixture(scope="module")
def operator(api_server: ApiServer) -> Iterator[OperatorThread]:
    running = OperatorThread(operator_config()).start()
    yield running
    running.stop()


def degraded(custom: kubernetes.client.CustomObjectsApi, name: str) -> dict[str, Any]:
    service = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
    conditions = service.get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "Degraded"), {})


def event_reasons(name: str) -> list[str]:
    events = kubernetes.client.CoreV1Api().list_namespaced_event(NS).items
    return [e.reason for e in events if e.involved_object.name == name]


@pytest.mark.parametrize("reason", sorted(BROKEN))
def test_a_worker_that_cannot_start_degrades_the_service_until_it_recovers(
    reason: str, operator, api_server, custom_api, apps_api
) -> None:
    name = f"broken-{reason.lower()}"
    body = load_example("service.yaml")
    body["metadata"]["name"] = name
    custom_api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    deployment = wait_for(
        lambda: apps_api.read_namespaced_deployment(name, NS), "the worker Deployment"
    )
    wait_for(lambda: degraded(custom_api, name).get("reason") == "AsExpected", "a first status")

    core = kubernetes.client.CoreV1Api()
    pod_name = f"{name}-5c8f7d-x2x9q"
    labels = deployment.spec.template.metadata.labels
    pod = {"metadata": {"name": pod_name, "namespace": NS, "labels": labels}, "spec": {}}
    core.create_namespaced_pod(NS, {**pod, "spec": {"containers": [{"name": "worker"}]}})
    status, detail = BROKEN[reason]
    core.patch_namespaced_pod_status(pod_name, NS, {"status": status})

    condition = wait_for(
        lambda: degraded(custom_api, name).get("status") == "True" and degraded(custom_api, name),
        f"Degraded=True ({reason})",
    )
    assert condition["reason"] == reason
    assert pod_name in condition["message"] and detail in condition["message"]
    wait_for(lambda: reason in event_reasons(name), f"a {reason} event")

    core.patch_namespaced_pod_status(pod_name, NS, {"status": RUNNING})
    recovered = wait_for(
        lambda: degraded(custom_api, name).get("status") == "False" and degraded(custom_api, name),
        "Degraded=False after the pod recovered",
    )
    assert recovered["reason"] == "AsExpected"
    wait_for(lambda: "Recovered" in event_reasons(name), "a Recovered event")


def test_pods_of_other_services_or_unmanaged_pods_change_nothing(
    operator, api_server, custom_api, apps_api
) -> None:
    body = load_example("service.yaml")
    body["metadata"]["name"] = "bystander"
    custom_api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    wait_for(lambda: degraded(custom_api, "bystander").get("reason") == "AsExpected", "a status")
    core = kubernetes.client.CoreV1Api()
    # the service's label without the operator's: someone else's pod, not a worker
    stray = {
        "metadata": {
            "name": "stray",
            "namespace": NS,
            "labels": {"radixserve.io/inferenceservice": "bystander"},
        },
        "spec": {"containers": [{"name": "worker"}]},
    }
    core.create_namespaced_pod(NS, stray)
    core.patch_namespaced_pod_status("stray", NS, {"status": BROKEN["CrashLoopBackOff"][0]})
    # a worker pod of a deleted (never created) service
    ghost_labels = {
        "app.kubernetes.io/managed-by": "radixserve-operator",
        "app.kubernetes.io/component": "worker",
        "app.kubernetes.io/name": "radixserve",
        "radixserve.io/inferenceservice": "ghost",
    }
    ghost = {**stray, "metadata": {"name": "ghost-1", "namespace": NS, "labels": ghost_labels}}
    core.create_namespaced_pod(NS, ghost)
    core.patch_namespaced_pod_status("ghost-1", NS, {"status": BROKEN["OOMKilled"][0]})
    # a broken pod that the operator does see, to know its events have been handled
    body["metadata"]["name"] = "witness"
    custom_api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    labels = wait_for(
        lambda: apps_api.read_namespaced_deployment("witness", NS), "the witness Deployment"
    ).spec.template.metadata.labels
    core.create_namespaced_pod(
        NS, {**stray, "metadata": {"name": "witness-1", "namespace": NS, "labels": labels}}
    )
    core.patch_namespaced_pod_status("witness-1", NS, {"status": BROKEN["OOMKilled"][0]})
    wait_for(lambda: degraded(custom_api, "witness").get("status") == "True", "witness Degraded")
    assert degraded(custom_api, "bystander")["status"] == "False"
