"""spec.loras with placement all, through the real operator and an emulated API server: the
adapter list is the ConfigMap's, and changing it leaves the worker pod template alone."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import kubernetes
import pytest
from operator_harness import OperatorThread, load_example, operator_config, wait_for

from radixserve_operator import GROUP, PLURAL, VERSION

NS = "default"
SQL = {"name": "sql", "source": "adapters/sql"}
CHAT = {"name": "chat", "source": "hf://org/chat-lora"}


@pytest.fixture(scope="module")
def operator(api_server) -> Iterator[OperatorThread]:
    running = OperatorThread(operator_config()).start()
    yield running
    running.stop()


def _deployment(apps: kubernetes.client.AppsV1Api, name: str) -> dict:
    deployment = apps.read_namespaced_deployment(name, NS)
    return apps.api_client.sanitize_for_serialization(deployment)


def _modules(name: str) -> str | None:
    try:
        config_map = kubernetes.client.CoreV1Api().read_namespaced_config_map(f"{name}-loras", NS)
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return None
        raise
    return (config_map.data or {}).get("modules")


def _patch(custom_api, name: str, spec: dict) -> None:
    custom_api.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name, {"spec": spec})


def test_a_change_of_loras_alone_restarts_no_pod(operator, custom_api, apps_api) -> None:
    body = copy.deepcopy(load_example("service.yaml"))
    name = body["metadata"]["name"] = "adapters"
    body["spec"].update(modelCache={"claimName": "models"}, loras=[SQL])
    custom_api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)

    wait_for(lambda: _modules(name) == "sql=/models/cache/adapters/sql\n", "the ConfigMap")
    before = wait_for(lambda: _deployment(apps_api, name), "the worker Deployment")
    args = before["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--lora-modules-file=/etc/radixserve/loras/modules" in args

    _patch(custom_api, name, {"loras": [SQL, CHAT]})
    wait_for(
        lambda: _modules(name) == "sql=/models/cache/adapters/sql\nchat=hf://org/chat-lora\n",
        "the ConfigMap with both adapters",
    )
    after = _deployment(apps_api, name)
    assert after["spec"]["template"] == before["spec"]["template"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"]

    # The last adapter gone: LoRA is off, its ConfigMap pruned (a rollout, documented).
    _patch(custom_api, name, {"loras": None})
    wait_for(lambda: _modules(name) is None, "the ConfigMap pruned")
    args = _deployment(apps_api, name)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any("lora" in arg for arg in args)
