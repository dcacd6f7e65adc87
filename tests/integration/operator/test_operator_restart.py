"""The operator stopped and started again converges; two peered replicas never both act."""

from __future__ import annotations

import copy

import kubernetes
from operator_harness import OperatorThread, load_example, operator_config, wait_for

from radixserve_operator import GROUP, PLURAL, VERSION

NS = "default"


def _service(name: str) -> dict:
    body = copy.deepcopy(load_example("service.yaml"))
    body["metadata"]["name"] = name
    return body


def _deployment(apps: kubernetes.client.AppsV1Api, name: str) -> kubernetes.client.V1Deployment:
    return apps.read_namespaced_deployment(name, NS)


def test_restart_mid_way_converges(api_server, custom_api, apps_api) -> None:
    first = OperatorThread(operator_config()).start()
    custom_api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, _service("restarted"))
    wait_for(lambda: _deployment(apps_api, "restarted"), "the first Deployment")
    first.stop()

    # While no operator runs: the spec changes and a child is deleted by hand.
    custom_api.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "restarted", {"spec": {"replicas": 3}}
    )
    kubernetes.client.CoreV1Api().delete_namespaced_service("restarted", NS)

    second = OperatorThread(operator_config()).start()
    try:
        wait_for(lambda: _deployment(apps_api, "restarted").spec.replicas == 3, "3 replicas")
        wait_for(
            lambda: kubernetes.client.CoreV1Api().read_namespaced_service("restarted", NS),
            "the Service applied again",
        )
        wait_for(
            lambda: (
                custom_api.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "restarted")[
                    "status"
                ]["observedGeneration"]
                == 2
            ),
            "observedGeneration 2 after the restart",
        )
    finally:
        second.stop()


def test_peered_replicas_elect_one_leader(api_server, custom_api, apps_api) -> None:
    custom_api.create_cluster_custom_object(
        "kopf.dev",
        "v1",
        "clusterkopfpeerings",
        {
            "apiVersion": "kopf.dev/v1",
            "kind": "ClusterKopfPeering",
            "metadata": {"name": "rs-test"},
        },
    )

    def peers() -> dict:
        peering = custom_api.get_cluster_custom_object(
            "kopf.dev", "v1", "clusterkopfpeerings", "rs-test"
        )
        return peering.get("status") or {}

    leader = OperatorThread(
        operator_config(peering="rs-test", priority=200, worker_image="leader:1")
    ).start()
    follower = OperatorThread(
        operator_config(peering="rs-test", priority=100, worker_image="follower:1")
    )
    try:
        wait_for(lambda: len(peers()) == 1, "the leader's keep-alive")
        follower.start()
        wait_for(lambda: len(peers()) == 2, "the follower's keep-alive")
        custom_api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, _service("led"))
        deployment = wait_for(lambda: _deployment(apps_api, "led"), "the Deployment")
        assert deployment.spec.template.spec.containers[0].image == "leader:1"
        # Every version written while both ran came from the leader: the follower stayed paused.
        wait_for(lambda: len(peers()) == 2, "both keep-alives still there")
        versions = api_server.emulator.objects["apps/v1/deployments", NS, "led"].history
        images = {v["spec"]["template"]["spec"]["containers"][0]["image"] for v in versions if v}
        assert images == {"leader:1"}

        # The leader goes away (its record with it): the follower takes over.
        leader.stop()
        custom_api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, _service("followed"))
        taken_over = wait_for(
            lambda: _deployment(apps_api, "followed"), "the follower's Deployment"
        )
        assert taken_over.spec.template.spec.containers[0].image == "follower:1"
    finally:
        for operator in (follower, leader):
            if operator.alive:
                operator.stop()
