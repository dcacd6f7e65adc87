"""spec.model.task on the real operator against an emulated API server: an embedding service
gets `--task=embed` and the same probes as any worker (`/health`, `/ready`: neither generates),
a change of task rolls the Deployment's arguments, `auto` leaves the flag out (the worker reads
the checkpoint), and a task the worker does not know is an invalid spec, not a crash loop."""

from __future__ import annotations

import copy
import socket
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from operator_harness import ApiServer, OperatorThread, load_example, operator_config, wait_for

from radixserve_operator import GROUP, PLURAL, VERSION

NS = "default"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def operator(api_server: ApiServer) -> Iterator[OperatorThread]:
    config = operator_config(liveness_port=free_port(), metrics_port=free_port())
    running = OperatorThread(config).start()
    yield running
    running.stop()


def service(name: str, task: str | None) -> dict[str, Any]:
    body = copy.deepcopy(load_example("service.yaml"))
    body["metadata"]["name"] = name
    body["spec"]["model"] = {"uri": "hf://Qwen/Qwen3-Embedding-0.6B", "name": name}
    if task is not None:
        body["spec"]["model"]["task"] = task
    return body


def container(apps: kubernetes.client.AppsV1Api, name: str) -> dict:
    deployment = apps.api_client.sanitize_for_serialization(
        apps.read_namespaced_deployment(name, NS)
    )
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_task_reaches_the_worker_with_probes_that_generate_nothing(
    operator, custom_api, apps_api
) -> None:
    custom_api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, service("emb", "embed"))
    worker = wait_for(lambda: container(apps_api, "emb"), "the worker Deployment")
    assert "--task=embed" in worker["args"]
    assert "--model=Qwen/Qwen3-Embedding-0.6B" in worker["args"]
    probes = {k: worker[k]["httpGet"]["path"] for k in ("startupProbe", "livenessProbe")}
    assert probes == {"startupProbe": "/health", "livenessProbe": "/health"}
    assert worker["readinessProbe"]["httpGet"]["path"] == "/ready"

    custom_api.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "emb", {"spec": {"model": {"task": "rerank"}}}
    )
    wait_for(lambda: "--task=rerank" in container(apps_api, "emb")["args"], "--task=rerank")

    custom_api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, service("detect", None))
    args = wait_for(lambda: container(apps_api, "detect"), "the Deployment")["args"]
    assert not any(arg.startswith("--task") for arg in args)


def test_an_unknown_task_is_an_invalid_spec(operator, custom_api, apps_api) -> None:
    custom_api.create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, service("classify", "classify")
    )

    def degraded() -> dict | None:
        status = custom_api.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "classify")
        conditions = status.get("status", {}).get("conditions", [])
        found = next((c for c in conditions if c["type"] == "Degraded"), None)
        return found if found and found["reason"] == "InvalidSpec" else None

    assert "task" in wait_for(degraded, "Degraded InvalidSpec")["message"]
    assert operator.alive
