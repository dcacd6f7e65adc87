"""spec.router against an emulated API server: the operator's children, and discovery at work.

The operator (real, in a thread) turns `examples/fleet.yaml` into the router's Deployment,
Services and RBAC; then a router started with the very arguments of that Deployment finds
stand-in workers through EndpointSlices of the workers' Service, and follows them as they
change.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from typing import Any

import aiohttp
import kubernetes
import pytest
from operator_harness import ApiServer, OperatorThread, load_example, operator_config, wait_for
from router_harness import ScriptedWorker, running_router, wait_until

from radixserve.router.args import parse_router_args
from radixserve.router.discovery import EndpointSliceDiscovery
from radixserve_operator import GROUP, PLURAL, VERSION
from radixserve_operator.spec import SCALE_TO_ZERO_NEEDS_ROUTER

NS = "default"
NAME = "smollm2-fleet"


@pytest.fixture(scope="module")
def operator(api_server: ApiServer) -> Iterator[OperatorThread]:
    running = OperatorThread(operator_config()).start()
    yield running
    running.stop()


def get_service(api: kubernetes.client.CustomObjectsApi, name: str) -> dict:
    return api.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)


def condition(service: dict, kind: str) -> dict:
    conditions = service.get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == kind), {})


def plain(obj: Any) -> dict:
    return kubernetes.client.ApiClient().sanitize_for_serialization(obj)


def router_deployment(apps: kubernetes.client.AppsV1Api) -> dict:
    return plain(apps.read_namespaced_deployment(f"{NAME}-router", NS))


def test_the_operator_creates_the_router_and_removes_it_again(
    operator, api_server, custom_api, apps_api
) -> None:
    core = kubernetes.client.CoreV1Api()
    rbac = kubernetes.client.RbacAuthorizationV1Api()
    custom_api.create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, load_example("fleet.yaml")
    )

    router = wait_for(lambda: router_deployment(apps_api), "the router Deployment")
    workers = wait_for(lambda: plain(apps_api.read_namespaced_deployment(NAME, NS)), "workers")
    router_pods = router["spec"]["template"]["metadata"]["labels"]
    assert router["spec"]["replicas"] == 2
    assert router["spec"]["template"]["spec"]["serviceAccountName"] == f"{NAME}-router"
    front = wait_for(lambda: plain(core.read_namespaced_service(NAME, NS)), "the Service")
    assert front["spec"]["selector"].items() <= router_pods.items()
    headless = plain(core.read_namespaced_service(f"{NAME}-workers", NS))
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"].items() <= (
        workers["spec"]["template"]["metadata"]["labels"].items()
    )
    assert plain(core.read_namespaced_service_account(f"{NAME}-router", NS))
    role = plain(rbac.read_namespaced_role(f"{NAME}-router", NS))
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
         "verbs": ["get", "list", "watch"]}
    ]  # fmt: skip
    binding = plain(rbac.read_namespaced_role_binding(f"{NAME}-router", NS))
    assert binding["roleRef"]["name"] == f"{NAME}-router"
    assert binding["subjects"][0]["name"] == f"{NAME}-router"

    # The router's pods come up: the status reports it.
    apps_api.patch_namespaced_deployment_status(
        f"{NAME}-router",
        NS,
        {"status": {"observedGeneration": 1, "replicas": 2, "readyReplicas": 2,
                    "updatedReplicas": 2}},
    )  # fmt: skip

    def routed_service() -> dict | None:
        service = get_service(custom_api, NAME)  # one read: the condition and counts agree
        return service if condition(service, "RouterReady").get("status") == "True" else None

    routed = wait_for(routed_service, "RouterReady=True")
    assert routed["status"]["router"] == {"replicas": 2, "readyReplicas": 2}

    # Router off (and a floor of 1, which scale-from-zero needs it for): its children go.
    custom_api.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, NAME,
        {"spec": {"router": {"enabled": False}, "autoscaling": {"minReplicas": 1}}},
    )  # fmt: skip
    wait_for(
        lambda: (
            plain(core.read_namespaced_service(NAME, NS))["spec"]["selector"].items()
            <= workers["spec"]["template"]["metadata"]["labels"].items()
        ),
        "the Service back on the workers",
    )

    def router_gone() -> bool:
        try:
            apps_api.read_namespaced_deployment(f"{NAME}-router", NS)
        except kubernetes.client.ApiException as error:
            return error.status == 404
        return False

    wait_for(router_gone, "the router Deployment deleted")
    for read in (
        lambda: core.read_namespaced_service(f"{NAME}-workers", NS),
        lambda: rbac.read_namespaced_role(f"{NAME}-router", NS),
    ):
        with pytest.raises(kubernetes.client.ApiException) as missing:
            read()
        assert missing.value.status == 404
    wait_for(
        lambda: (
            "RouterReady"
            not in {c["type"] for c in get_service(custom_api, NAME)["status"]["conditions"]}
        ),
        "no router in the status",
    )
    assert operator.alive


def test_scaling_to_zero_without_a_router_is_refused(operator, custom_api, apps_api) -> None:
    body = copy.deepcopy(load_example("fleet.yaml"))
    body["metadata"]["name"] = "no-router"
    del body["spec"]["router"]
    custom_api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    degraded = wait_for(
        lambda: (
            condition(get_service(custom_api, "no-router"), "Degraded").get("status") == "True"
            and condition(get_service(custom_api, "no-router"), "Degraded")
        ),
        "Degraded=True",
    )
    assert (degraded["reason"], degraded["message"]) == ("InvalidSpec", SCALE_TO_ZERO_NEEDS_ROUTER)
    with pytest.raises(kubernetes.client.ApiException) as missing:
        apps_api.read_namespaced_deployment("no-router", NS)
    assert missing.value.status == 404


def endpoint_slice(
    name: str, worker: ScriptedWorker, ready: bool = True, service: str = ""
) -> dict:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"kubernetes.io/service-name": service or f"{NAME}-workers"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": worker.port, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": ready}}],
    }


def test_the_router_follows_endpointslices_as_they_change(operator, api_server, apps_api) -> None:
    """A router with the Deployment's own arguments (host and port aside) against the slices."""
    body = copy.deepcopy(load_example("fleet.yaml"))
    body["metadata"]["name"] = "follow"
    kubernetes.client.CustomObjectsApi().create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, body
    )
    deployment = wait_for(
        lambda: plain(apps_api.read_namespaced_deployment("follow-router", NS)), "its router"
    )
    args = parse_router_args(deployment["spec"]["template"]["spec"]["containers"][0]["args"][1:])
    assert args.discover_selector == "kubernetes.io/service-name=follow-workers"
    discovery_api = kubernetes.client.DiscoveryV1Api()

    def put(piece: dict) -> None:
        piece["metadata"]["labels"]["kubernetes.io/service-name"] = piece["metadata"]["labels"][
            "kubernetes.io/service-name"
        ].replace(NAME, "follow")
        discovery_api.create_namespaced_endpoint_slice(NS, piece)

    async def scenario() -> None:
        a, b, c = ScriptedWorker("a"), ScriptedWorker("b"), ScriptedWorker("c")
        for worker in (a, b, c):
            await worker.start()
        await asyncio.to_thread(put, endpoint_slice("follow-a", a))
        await asyncio.to_thread(put, endpoint_slice("other", c, service="someone-else"))
        discovery = EndpointSliceDiscovery(
            namespace=args.namespace, selector=args.discover_selector, port=args.discover_port
        )
        assert await asyncio.to_thread(discovery.connect) == {a.url}
        settings = {"policy": "round_robin", "discover_selector": args.discover_selector}
        async with (
            running_router(discovery, **settings) as (router, url),
            aiohttp.ClientSession() as s,
        ):

            async def served_by() -> set[str]:
                names = set()
                for _ in range(6):
                    body = {"model": "m", "prompt": "hi"}
                    async with s.post(url + "/v1/completions", json=body) as reply:
                        assert reply.status == 200
                        names.add((await reply.json())["worker"])
                return names

            assert await served_by() == {"a"}
            await asyncio.to_thread(put, endpoint_slice("follow-b", b))
            await wait_until(lambda: len(router.pool.members()) == 2)
            assert await served_by() == {"a", "b"}
            # a's pod turns not ready (draining): it leaves the pool, b serves alone.
            await asyncio.to_thread(
                discovery_api.patch_namespaced_endpoint_slice,
                "follow-a",
                NS,
                {"endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": False}}]},
            )
            await wait_until(lambda: [u.url for u in router.pool.members()] == [b.url])
            assert await served_by() == {"b"}
            await asyncio.to_thread(discovery_api.delete_namespaced_endpoint_slice, "follow-b", NS)
            await wait_until(lambda: not router.pool.members())
            async with s.get(url + "/ready") as reply:
                assert reply.status == 503
        # Closing the router stopped the discovery; its watch thread ends at the next event.
        # One more slice is that event: the thread closes its watch now, instead of leaving the
        # stream open for the API server's shutdown to wait out (30 s, at module teardown).
        await asyncio.to_thread(put, endpoint_slice("follow-c", c))
        watcher = discovery._thread
        assert watcher is not None
        await asyncio.to_thread(watcher.join, 10)
        assert not watcher.is_alive(), "the stopped discovery kept watching"
        for worker in (a, b, c):
            await worker.stop()

    asyncio.run(scenario())
