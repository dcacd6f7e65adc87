"""The real operator against an emulated API server: create, edit, ready, invalid, delete."""

from __future__ import annotations

import copy
import json
import socket
import urllib.request
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from operator_harness import ApiServer, OperatorThread, load_example, operator_config, wait_for

from radixserve_operator import GROUP, PLURAL, VERSION
from radixserve_operator.metrics import SERVICE_READY

NS = "default"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def ports() -> dict[str, int]:
    return {"liveness": free_port(), "metrics": free_port()}


@pytest.fixture(scope="module")
def operator(api_server: ApiServer, ports: dict[str, int]) -> Iterator[OperatorThread]:
    config = operator_config(liveness_port=ports["liveness"], metrics_port=ports["metrics"])
    running = OperatorThread(config).start()
    yield running
    running.stop()


def create_service(api: kubernetes.client.CustomObjectsApi, body: dict[str, Any]) -> dict:
    api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    return get_service(api, body["metadata"]["name"])


def get_service(api: kubernetes.client.CustomObjectsApi, name: str) -> dict:
    return api.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)


def condition(service: dict, kind: str) -> dict:
    return next(
        (c for c in service.get("status", {}).get("conditions", []) if c["type"] == kind), {}
    )


def wait_for_invalid_spec(api: kubernetes.client.CustomObjectsApi, name: str) -> dict:
    """The service's Degraded condition, once its reason is InvalidSpec."""
    return wait_for(
        lambda: (
            condition(get_service(api, name), "Degraded").get("reason") == "InvalidSpec"
            and condition(get_service(api, name), "Degraded")
        ),
        f"{name}: Degraded InvalidSpec",
    )


def events_for(api_server: ApiServer, name: str) -> list[dict]:
    core = kubernetes.client.CoreV1Api()
    events = core.list_namespaced_event(NS).items
    return [e for e in events if e.involved_object.name == name]


def read_deployment(apps: kubernetes.client.AppsV1Api, name: str) -> dict:
    return apps.api_client.sanitize_for_serialization(apps.read_namespaced_deployment(name, NS))


def test_create_edit_ready_delete(operator, api_server, custom_api, apps_api) -> None:
    example = load_example("service.yaml")
    created = create_service(custom_api, example)
    name, uid = created["metadata"]["name"], created["metadata"]["uid"]

    deployment = wait_for(lambda: read_deployment(apps_api, name), "the worker Deployment")
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == uid
    assert deployment["metadata"]["labels"]["radixserve.io/inferenceservice"] == name
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "radixserve:test"
    assert container["args"][:2] == ["serve", "--model=builtin:smollm2-135m"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert deployment["spec"]["replicas"] == 1
    service = wait_for(
        lambda: kubernetes.client.CoreV1Api().read_namespaced_service(name, NS), "the Service"
    )
    assert service.spec.ports[0].port == 8000
    pdb = kubernetes.client.PolicyV1Api().read_namespaced_pod_disruption_budget(name, NS)
    assert pdb.spec.max_unavailable == 1

    # Nothing is ready yet: the status says so, for the generation it saw.
    status = wait_for(
        lambda: (
            get_service(custom_api, name).get("status", {}).get("conditions")
            and get_service(custom_api, name)["status"]
        ),
        "a first status",
    )
    assert status["observedGeneration"] == 1
    assert condition({"status": status}, "Ready")["status"] == "False"
    assert status["url"] == f"http://{name}.{NS}.svc:8000"
    assert (
        status["selector"]
        == f"app.kubernetes.io/name=radixserve,radixserve.io/inferenceservice={name}"
    )

    # Edit the spec: the Deployment follows, and so does observedGeneration.
    custom_api.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        NS,
        PLURAL,
        name,
        {"spec": {"replicas": 2, "engine": {"maxRunningRequests": 4}}},
    )
    wait_for(lambda: read_deployment(apps_api, name)["spec"]["replicas"] == 2, "2 replicas")
    args = read_deployment(apps_api, name)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--max-running-requests=4" in args
    wait_for(
        lambda: get_service(custom_api, name)["status"]["observedGeneration"] == 2,
        "observedGeneration 2",
    )

    # The deployment controller reports ready pods: the service becomes Ready.
    apps_api.patch_namespaced_deployment_status(
        name,
        NS,
        {
            "status": {
                "observedGeneration": 2,
                "replicas": 2,
                "updatedReplicas": 2,
                "readyReplicas": 2,
                "availableReplicas": 2,
            }
        },
    )
    ready = wait_for(
        lambda: (
            condition(get_service(custom_api, name), "Ready").get("status") == "True"
            and get_service(custom_api, name)
        ),
        "Ready=True",
    )
    assert ready["status"]["readyReplicas"] == 2
    assert condition(ready, "Progressing")["reason"] == "RolloutComplete", ready["status"]
    assert condition(ready, "Degraded")["status"] == "False"
    wait_for(
        lambda: any(e.reason == "Ready" for e in events_for(api_server, name)), "a Ready event"
    )
    assert SERVICE_READY.labels(NS, name)._value.get() == 1

    # Delete: no finalizer holds it, children are garbage (owner-referenced), metrics forgotten.
    custom_api.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
    wait_for(
        lambda: (
            not any(k[2] == name and not o.deleted for k, o in api_server.emulator.objects.items())
        ),
        "the service and its children gone",
    )
    wait_for(
        lambda: (
            (NS, name) not in {tuple(s.labels.values()) for s in SERVICE_READY.collect()[0].samples}
        ),
        "the per-service metric removed",
    )
    assert operator.alive


def test_invalid_spec_is_degraded_not_crashing(operator, api_server, custom_api, apps_api) -> None:
    body = copy.deepcopy(load_example("gpu-llama.yaml"))
    body["metadata"]["name"] = "too-few-gpus"
    body["spec"]["engine"]["tensorParallelSize"] = 4
    body["spec"]["resources"]["gpu"] = 2
    create_service(custom_api, body)

    degraded = wait_for(
        lambda: (
            condition(get_service(custom_api, "too-few-gpus"), "Degraded").get("status") == "True"
            and condition(get_service(custom_api, "too-few-gpus"), "Degraded")
        ),
        "Degraded=True",
    )
    assert degraded["reason"] == "InvalidSpec"
    assert "tensorParallelSize" in degraded["message"]
    warning = wait_for(
        lambda: [e for e in events_for(api_server, "too-few-gpus") if e.reason == "InvalidSpec"],
        "an InvalidSpec event",
    )
    assert warning[0].type == "Warning"
    with pytest.raises(kubernetes.client.ApiException) as missing:
        apps_api.read_namespaced_deployment("too-few-gpus", NS)
    assert missing.value.status == 404

    # Fixing the spec recovers it; the operator never stopped.
    custom_api.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "too-few-gpus", {"spec": {"resources": {"gpu": 4}}}
    )
    deployment = wait_for(lambda: read_deployment(apps_api, "too-few-gpus"), "the Deployment")
    limits = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "4"
    wait_for(
        lambda: (
            condition(get_service(custom_api, "too-few-gpus"), "Degraded").get("reason")
            != "InvalidSpec"
        ),
        "InvalidSpec cleared",
    )
    assert operator.alive


def test_host_kv_tier_reaches_the_worker_and_needs_the_radix_cache(
    operator, api_server, custom_api, apps_api
) -> None:
    """spec.engine.kvHostMemory becomes --kv-host-memory and kvDiskSize the disk tier on the
    model-cache volume; without the radix cache it is an invalid spec (Degraded, no
    Deployment) until the tier or the cache is fixed."""
    body = copy.deepcopy(load_example("service.yaml"))
    body["metadata"]["name"] = "host-tier"
    engine = {"kvHostMemory": 32, "kvDiskSize": 100, "radixCache": False}
    body["spec"].setdefault("engine", {}).update(engine)
    create_service(custom_api, body)
    degraded = wait_for_invalid_spec(custom_api, "host-tier")
    assert "kvHostMemory" in degraded["message"]
    custom_api.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "host-tier", {"spec": {"engine": {"radixCache": True}}}
    )
    deployment = wait_for(lambda: read_deployment(apps_api, "host-tier"), "the Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--kv-host-memory=32.0" in args
    assert "--kv-disk-path=/models/cache/kv-cache" in args and "--kv-disk-size=100.0" in args
    assert "--disable-radix-cache" not in args
    assert operator.alive


def test_kv_events_reach_the_worker_and_its_service(
    operator, api_server, custom_api, apps_api
) -> None:
    """spec.engine.kvEvents: the worker publishes on its port, the Service exposes it."""
    body = copy.deepcopy(load_example("service.yaml"))
    body["metadata"]["name"] = "kv-events"
    body["spec"].setdefault("engine", {})["kvEvents"] = {"enabled": True, "port": 5557}
    create_service(custom_api, body)
    deployment = wait_for(lambda: read_deployment(apps_api, "kv-events"), "the Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--kv-events-endpoint=tcp://*:5557" in container["args"]
    assert {"name": "kv-events", "containerPort": 5557, "protocol": "TCP"} in container["ports"]
    service = wait_for(
        lambda: kubernetes.client.CoreV1Api().read_namespaced_service("kv-events", NS),
        "the Service",
    )
    assert {(p.name, p.port) for p in service.spec.ports} == {("http", 8000), ("kv-events", 5557)}
    assert operator.alive


def test_speculative_decoding_reaches_the_worker(
    operator, api_server, custom_api, apps_api
) -> None:
    """spec.engine.speculative becomes the worker's --speculative-* flags; an unknown method is
    an invalid spec (Degraded, no Deployment) until it is fixed."""
    body = copy.deepcopy(load_example("service.yaml"))
    body["metadata"]["name"] = "speculative"
    body["spec"].setdefault("engine", {})["speculative"] = {"method": "medusa", "numTokens": 5}
    create_service(custom_api, body)
    degraded = wait_for_invalid_spec(custom_api, "speculative")
    assert "method" in degraded["message"]
    custom_api.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        NS,
        PLURAL,
        "speculative",
        {"spec": {"engine": {"speculative": {"method": "ngram", "numTokens": 5}}}},
    )
    deployment = wait_for(lambda: read_deployment(apps_api, "speculative"), "the Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--speculative-method=ngram" in args and "--speculative-num-tokens=5" in args
    assert operator.alive


def test_deployment_deleted_by_hand_comes_back(operator, api_server, custom_api, apps_api) -> None:
    body = copy.deepcopy(load_example("service.yaml"))
    body["metadata"]["name"] = "self-healing"
    create_service(custom_api, body)
    first = wait_for(lambda: read_deployment(apps_api, "self-healing"), "the Deployment")
    apps_api.delete_namespaced_deployment("self-healing", NS)
    wait_for(
        lambda: (
            read_deployment(apps_api, "self-healing")["metadata"]["uid"] != first["metadata"]["uid"]
        ),
        "a new Deployment",
    )
    assert operator.alive


def test_liveness_and_metrics_endpoints(operator, ports, custom_api, apps_api) -> None:
    """Runs after the others: the liveness probe reports reconciles, metrics count them."""
    liveness = wait_for(
        lambda: json.loads(
            urllib.request.urlopen(f"http://127.0.0.1:{ports['liveness']}/healthz").read()
        ),
        "the liveness endpoint",
    )
    assert liveness["reconciles"] >= 1
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics']}/metrics").read().decode()
    assert 'radixserve_operator_reconciles_total{result="applied"}' in metrics
    assert 'radixserve_operator_reconciles_total{result="invalid"}' in metrics
    assert "radixserve_operator_reconcile_duration_seconds_count" in metrics
