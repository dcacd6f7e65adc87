"""spec.loras, through the real operator and an emulated API server: the adapter list is the
ConfigMap's, changing it leaves the worker pod template alone, and running workers (a fake
worker's LoRA API here) get the change through their admin endpoints: read at once with
placement all, registered to be read on first use with onDemand."""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator

import kubernetes
import pytest
from fake_lora_worker import FakeLoRAWorker
from operator_harness import OperatorThread, load_example, operator_config, wait_for

from radixserve_operator import GROUP, PLURAL, VERSION
from radixserve_operator.metrics import ERRORS

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


BIG = {"name": "big", "source": "adapters/rank-64"}
RANK_REFUSAL = "adapter rank 64 exceeds --max-lora-rank 16"
KEY = "s3cret-admin"


def _service(custom_api, name: str) -> dict:
    return custom_api.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)


def _lora_status(custom_api, name: str) -> list[dict]:
    return (_service(custom_api, name).get("status") or {}).get("loras") or []


def _condition(custom_api, name: str) -> dict:
    conditions = (_service(custom_api, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "LoraLoadFailed"), {})


def _event_reasons(name: str) -> list[str]:
    events = kubernetes.client.CoreV1Api().list_namespaced_event(NS).items
    return [e.reason for e in events if e.involved_object.name == name]


def _start_worker_pod(core, deployment: dict, name: str, port: int) -> None:
    """Play the ReplicaSet controller and the kubelet: one ready worker pod of the template,
    its http port the fake worker's, its IP loopback."""
    template = deployment["spec"]["template"]
    labels = template["metadata"]["labels"]
    container = {
        "name": "worker",
        "args": template["spec"]["containers"][0]["args"],  # with --lora-modules-file
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
    }
    meta = {"name": name, "namespace": NS, "labels": labels}
    core.create_namespaced_pod(NS, {"metadata": meta, "spec": {"containers": [container]}})
    ready = {
        "phase": "Running",
        "podIP": "127.0.0.1",
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    core.patch_namespaced_pod_status(name, NS, {"status": ready})


def test_adapters_reach_running_workers_with_status_and_refusals(
    operator, custom_api, apps_api
) -> None:
    """placement all: a change of spec.loras is loaded into and unloaded from a running worker
    through its admin endpoints (with the admin key of spec.apiKeySecretRef), the pod template
    untouched; status.loras counts the ready workers per adapter; a refused load is the
    LoraLoadFailed condition with the worker's message and a Warning Event."""
    core = kubernetes.client.CoreV1Api()
    name = "hot-adapters"
    secret = {"metadata": {"name": "hot-key", "namespace": NS}, "stringData": {"key": KEY}}
    secret["data"] = {"key": base64.b64encode(KEY.encode()).decode()}
    core.create_namespaced_secret(NS, secret)
    body = copy.deepcopy(load_example("service.yaml"))
    body["metadata"]["name"] = name
    body["spec"].update(
        modelCache={"claimName": "models"},
        loras=[SQL],
        apiKeySecretRef={"name": "hot-key", "key": "key"},
    )
    custom_api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    before = wait_for(lambda: _deployment(apps_api, name), "the worker Deployment")
    started_with = {"sql": "/models/cache/adapters/sql"}  # the ConfigMap's list at start
    refuse = {"/models/cache/adapters/rank-64": RANK_REFUSAL}
    with FakeLoRAWorker(started_with, key=KEY, refuse=refuse) as worker:
        _start_worker_pod(core, before, f"{name}-7d9f-abcde", worker.port)
        wait_for(
            lambda: (
                _lora_status(custom_api, name)
                == [{"name": "sql", "source": "adapters/sql", "readyWorkers": 1}]
            ),
            "sql held by the one ready worker",
        )
        assert worker.calls == []  # it already had it: nothing to do

        _patch(custom_api, name, {"loras": [SQL, CHAT, BIG]})
        wait_for(lambda: _condition(custom_api, name).get("status") == "True", "LoraLoadFailed")
        assert ("load", {"lora_name": "chat", "lora_path": "hf://org/chat-lora"}) in worker.calls
        assert worker.adapters == {"sql": started_with["sql"], "chat": "hf://org/chat-lora"}
        condition = _condition(custom_api, name)
        assert condition["reason"] == "LoadFailed" and RANK_REFUSAL in condition["message"]
        assert f"{name}-7d9f-abcde" in condition["message"]
        loras = wait_for(
            lambda: (
                [e.get("readyWorkers") for e in _lora_status(custom_api, name)] == [1, 1, 0]
                and _lora_status(custom_api, name)
            ),
            "per-adapter counts",
        )
        assert RANK_REFUSAL in loras[2]["message"]
        wait_for(lambda: "LoraLoadFailed" in _event_reasons(name), "a LoraLoadFailed Event")
        # refused once, not asked again every round
        assert sum(1 for call in worker.calls if call[1]["lora_name"] == "big") == 1

        _patch(custom_api, name, {"loras": [CHAT]})
        wait_for(lambda: worker.adapters == {"chat": "hf://org/chat-lora"}, "sql unloaded")
        assert ("unload", {"lora_name": "sql"}) in worker.calls
        wait_for(
            lambda: (
                _lora_status(custom_api, name)
                == [{"name": "chat", "source": "hf://org/chat-lora", "readyWorkers": 1}]
            ),
            "only chat",
        )
        wait_for(lambda: _condition(custom_api, name).get("status") == "False", "recovered")
        wait_for(lambda: "LorasLoaded" in _event_reasons(name), "a LorasLoaded Event")

    after = _deployment(apps_api, name)
    assert after["spec"]["template"] == before["spec"]["template"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"]


def test_a_worker_that_refuses_the_key_is_skipped_not_fatal(operator, custom_api, apps_api) -> None:
    """A pod answering 401 (a key the operator does not have) is left out of the counts and
    tried again each round; nothing is loaded, nothing crashes, no refusal is reported."""
    core = kubernetes.client.CoreV1Api()
    name = "wrong-key"
    body = copy.deepcopy(load_example("service.yaml"))
    body["metadata"]["name"] = name
    body["spec"].update(modelCache={"claimName": "models"}, loras=[SQL])
    custom_api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    deployment = wait_for(lambda: _deployment(apps_api, name), "the worker Deployment")
    with FakeLoRAWorker({}, key="a-key-the-operator-lacks", refuse={}) as worker:
        errors = ERRORS.labels("adapters")._value.get()
        _start_worker_pod(core, deployment, f"{name}-5c4b-fghij", worker.port)
        wait_for(
            lambda: ERRORS.labels("adapters")._value.get() > errors, "a round that met the 401"
        )
        # the round writes status after it counts the error: wait for it, not a moment
        expected = [{"name": "sql", "source": "adapters/sql", "readyWorkers": 0}]
        wait_for(lambda: _lora_status(custom_api, name) == expected, "status.loras written")
        assert worker.calls == [] and worker.adapters == {}
        assert _condition(custom_api, name).get("status") == "False"
    assert operator.alive


def test_on_demand_workers_know_every_adapter_and_read_it_on_first_use(
    operator, custom_api, apps_api
) -> None:
    """placement onDemand: the pods get the ConfigMap's list with --lora-load lazy; the sync
    registers a new adapter on a running worker (a lazy load reads nothing) and never reads
    one; readyWorkers counts the workers where a request made it resident; a failed first
    read is LoraLoadFailed with the worker's message."""
    name = "on-demand"
    body = copy.deepcopy(load_example("service.yaml"))
    body["metadata"]["name"] = name
    body["spec"].update(
        modelCache={"claimName": "models"}, loras=[SQL], loraPlacement="onDemand", maxLoras=2
    )
    custom_api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    deployment = wait_for(lambda: _deployment(apps_api, name), "the worker Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--lora-load=lazy" in args and "--max-loras=2" in args
    assert "--lora-modules-file=/etc/radixserve/loras/modules" in args
    assert wait_for(lambda: _modules(name), "the list") == "sql=/models/cache/adapters/sql\n"
    started_with = {"sql": "/models/cache/adapters/sql"}
    refuse = {"/models/cache/adapters/rank-64": RANK_REFUSAL}
    core = kubernetes.client.CoreV1Api()
    with FakeLoRAWorker(started_with, key=None, refuse=refuse, lazy=True) as worker:
        _start_worker_pod(core, deployment, f"{name}-6a5b-klmno", worker.port)
        _patch(custom_api, name, {"loras": [SQL, CHAT, BIG]})
        wait_for(lambda: set(worker.adapters) == {"sql", "chat", "big"}, "chat and big known")
        assert [call[0] for call in worker.calls] == ["load", "load"]  # registered, not sql
        wait_for(
            lambda: [e.get("readyWorkers") for e in _lora_status(custom_api, name)] == [0, 0, 0],
            "known everywhere, resident nowhere",
        )
        assert worker.resident == [] and _condition(custom_api, name).get("status") == "False"

        worker.serve("chat")  # a request routed here reads chat into a slot
        wait_for(
            lambda: [e.get("readyWorkers") for e in _lora_status(custom_api, name)] == [0, 1, 0],
            "chat resident on the worker",
        )
        worker.serve("big")  # its read fails: the request's 400, the service's condition
        wait_for(lambda: _condition(custom_api, name).get("status") == "True", "LoraLoadFailed")
        assert RANK_REFUSAL in _condition(custom_api, name)["message"]
        assert RANK_REFUSAL in _lora_status(custom_api, name)[2]["message"]
        assert len(worker.calls) == 2  # nothing more asked of the worker
    after = _deployment(apps_api, name)
    assert after["spec"]["template"] == deployment["spec"]["template"]
