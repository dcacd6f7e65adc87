"""spec.loras on running workers, the pure parts: which pods are reached where, what a round
loads and unloads, which key it sends, the status and Events it writes, and the schedule that
runs one round at a time per service."""

from __future__ import annotations

import asyncio
import base64
import contextvars
from typing import Any

from radixserve_operator.lora_sync import (
    RETRY_REFUSED_SECONDS,
    RefusedLoads,
    SyncSchedule,
    WorkerAdapters,
    adapter_status,
    plan,
    read_admin_key,
    ready_workers,
    serves_adapters,
)
from radixserve_operator.metrics import ERRORS
from radixserve_operator.spec import SecretKeyRef, parse_spec
from radixserve_operator.status import LORA_LOAD_FAILED, compute_status
from radixserve_operator.worker_api import WorkerEndpoint

CACHED = {"model": {"uri": "builtin:smollm2-135m"}, "modelCache": {"claimName": "models"}}
SQL = {"name": "sql", "source": "adapters/sql"}
CHAT = {"name": "chat", "source": "hf://org/chat-lora@v2"}
REFUSAL = "pod w-1: adapter rank 64 exceeds --max-lora-rank 16"


def parsed(**spec: Any) -> Any:
    return parse_spec({**CACHED, **spec}, name="svc", default_image="img")


def pod(name: str, *, ready: bool = True, ip: str | None = "10.0.0.7", **extra: Any) -> dict:
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": str(ready)}]}
    if ip:
        status["podIP"] = ip
    container = {
        "name": "worker",
        "args": ["serve", "--lora-modules-file=/etc/radixserve/loras/modules"],
        "ports": [{"name": "http", "containerPort": 8000}],
    }
    meta = {"name": name, "uid": f"uid-{name}", **extra}
    return {"metadata": meta, "spec": {"containers": [container]}, "status": status}


def test_only_ready_pods_are_reached_at_their_http_port() -> None:
    custom_port = pod("w-3", ip="fd00::7")
    custom_port["spec"]["containers"][0]["ports"][0]["containerPort"] = 9000
    lora_off = pod("w-5")  # started before LoRA was on: the rollout replaces it
    lora_off["spec"]["containers"][0]["args"] = ["serve"]
    pods = [
        pod("w-2"),
        pod("w-1", ready=False),
        pod("w-0", ip=None),
        pod("w-4", deletionTimestamp="2026-01-01T00:00:00Z"),
        custom_port,
        lora_off,
    ]
    assert ready_workers(pods) == [
        WorkerEndpoint("w-2", "uid-w-2", "http://10.0.0.7:8000"),
        WorkerEndpoint("w-3", "uid-w-3", "http://[fd00::7]:9000"),
    ]


def test_a_round_loads_what_is_missing_or_moved_and_unloads_the_rest() -> None:
    wanted = {"sql": "/models/cache/adapters/sql", "chat": "hf://org/chat-lora@v2"}
    held = {"sql": "/models/cache/adapters/sql", "chat": "hf://org/chat-lora", "old": "/x"}
    assert plan(wanted, held) == ({"chat": "hf://org/chat-lora@v2"}, ["old"])
    assert plan(wanted, wanted) == ({}, [])


def test_a_refused_load_waits_before_it_is_tried_again() -> None:
    refused = RefusedLoads()
    key = ("uid-w-1", "big", "/models/cache/adapters/big")
    refused.record(key, REFUSAL, now=100.0)
    assert not refused.due(key, 100.0 + RETRY_REFUSED_SECONDS - 1)
    assert refused.due(key, 100.0 + RETRY_REFUSED_SECONDS)
    assert refused.message(key) == REFUSAL
    refused.keep_pods(["uid-w-2"])  # w-1 is gone
    assert refused.due(key, 101.0) and refused.message(key) is None


class FakeApi:
    def __init__(self, secrets: dict[str, dict[str, str]]) -> None:
        self.secrets = secrets
        self.reads: list[tuple[str, str]] = []

    def read_secret(self, namespace: str, name: str) -> dict | None:
        self.reads.append((namespace, name))
        data = self.secrets.get(name)
        return None if data is None else {"data": data}


def encoded(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


def test_the_admin_key_is_the_one_the_pods_get() -> None:
    api = FakeApi({"keys": {"api": encoded("api-key"), "admin": encoded("admin-key")}})
    with_api_key = parsed(apiKeySecretRef={"name": "keys", "key": "api"})
    assert with_api_key.admin_key == SecretKeyRef("keys", "api")
    assert read_admin_key(api, "ns", with_api_key) == "api-key"  # type: ignore[arg-type]
    assert api.reads == [("ns", "keys")]  # by name, nothing listed
    admin_ref = {"secretKeyRef": {"name": "keys", "key": "admin"}}
    with_admin_key = parsed(
        apiKeySecretRef={"name": "keys", "key": "api"},
        env=[{"name": "RADIXSERVE_ADMIN_API_KEY", "valueFrom": admin_ref}],
    )
    assert read_admin_key(api, "ns", with_admin_key) == "admin-key"  # type: ignore[arg-type]
    literal = parsed(env=[{"name": "RADIXSERVE_ADMIN_API_KEY", "value": "plain"}])
    assert read_admin_key(api, "ns", literal) == "plain"  # type: ignore[arg-type]
    assert read_admin_key(api, "ns", parsed()) is None  # type: ignore[arg-type]
    missing = parsed(apiKeySecretRef={"name": "absent", "key": "api"})
    assert read_admin_key(api, "ns", missing) is None  # type: ignore[arg-type]


def worker(name: str, held: dict[str, str] | None, refused: dict[str, str] | None = None):
    endpoint = WorkerEndpoint(name, f"uid-{name}", f"http://{name}:8000")
    return WorkerAdapters(endpoint, held, refused or {})


def test_status_counts_ready_holders_and_a_refusal_is_a_condition_and_an_event() -> None:
    spec = parsed(loras=[SQL, CHAT])
    sql_path = "/models/cache/adapters/sql"
    workers = [
        worker("w-1", {"sql": sql_path}, {"chat": REFUSAL}),
        worker("w-2", {"sql": sql_path, "chat": "hf://org/chat-lora@v2"}),
        worker("w-3", None),  # not reached this round: counts for nothing
    ]
    status, events = adapter_status({"conditions": []}, spec, workers, "T1")
    assert status["loras"] == [
        {"name": "sql", "source": "adapters/sql", "readyWorkers": 2},
        {"name": "chat", "source": "hf://org/chat-lora@v2", "readyWorkers": 1, "message": REFUSAL},
    ]
    (condition,) = status["conditions"]
    assert condition["type"] == LORA_LOAD_FAILED and condition["status"] == "True"
    assert condition["reason"] == "LoadFailed" and REFUSAL in condition["message"]
    assert events == [("Warning", LORA_LOAD_FAILED, condition["message"])]

    # the same refusal again: no new Event, the transition time kept
    again, events = adapter_status(status, spec, workers, "T2")
    assert events == [] and again["conditions"][0]["lastTransitionTime"] == "T1"

    # loaded after all: the condition flips back, with a Normal Event
    healed = [worker("w-1", {"sql": sql_path, "chat": "hf://org/chat-lora@v2"})]
    recovered, events = adapter_status(again, spec, healed, "T3")
    assert recovered["conditions"][0]["status"] == "False"
    assert events == [("Normal", "LorasLoaded", recovered["conditions"][0]["message"])]


def test_on_demand_counts_the_workers_an_adapter_is_resident_on() -> None:
    """onDemand: every worker knows every adapter; readyWorkers counts those that have it in
    a device slot, and a failed first read is reported as a refusal is."""
    spec = parsed(loras=[SQL, CHAT], loraPlacement="onDemand")
    known = {"sql": "/models/cache/adapters/sql", "chat": "hf://org/chat-lora@v2"}
    failed = "pod w-2: adapter 'hf://org/chat-lora@v2': cannot get 'org/chat-lora'"
    workers = [
        WorkerAdapters(WorkerEndpoint("w-1", "u1", "http://w-1"), known, {}, frozenset({"sql"})),
        WorkerAdapters(
            WorkerEndpoint("w-2", "u2", "http://w-2"), known, {"chat": failed}, frozenset()
        ),
    ]
    status, events = adapter_status({}, spec, workers, "T1")
    assert status["loras"] == [
        {"name": "sql", "source": "adapters/sql", "readyWorkers": 1},
        {"name": "chat", "source": "hf://org/chat-lora@v2", "readyWorkers": 0, "message": failed},
    ]
    assert events[0][:2] == ("Warning", LORA_LOAD_FAILED)


def test_the_reconcile_keeps_the_adapter_condition() -> None:
    failed = {
        "type": LORA_LOAD_FAILED,
        "status": "True",
        "reason": "LoadFailed",
        "message": REFUSAL,
        "lastTransitionTime": "T0",
    }
    status = compute_status(
        observed_generation=2,
        deployment=None,
        problem=None,
        selector="s",
        url=None,
        previous={"conditions": [failed]},
        now="T1",
    )
    assert failed in status["conditions"]


def test_which_services_are_synced() -> None:
    assert serves_adapters({"spec": {"loras": [SQL]}})
    assert serves_adapters({"spec": {}, "status": {"loras": [{"name": "sql"}]}})
    assert not serves_adapters({"spec": {}, "status": {"loras": []}})


def test_one_round_at_a_time_per_service_and_one_more_after_a_change() -> None:
    async def scenario() -> list[tuple[str, str]]:
        rounds: list[tuple[str, str]] = []
        release = asyncio.Event()

        async def sync(namespace: str, name: str) -> None:
            rounds.append((namespace, name))
            await release.wait()

        schedule = SyncSchedule(sync)
        schedule.track("ns", "a", 1, serves=True)
        schedule.track("ns", "a", 1, serves=True)  # a status event: no new round
        schedule.track("ns", "b", 1, serves=False)  # no adapters: never synced
        await asyncio.sleep(0)
        schedule.track("ns", "a", 2, serves=True)  # a spec change during the round
        await asyncio.sleep(0)
        assert rounds == [("ns", "a")]
        release.set()
        for _ in range(5):
            await asyncio.sleep(0)
        await schedule.close()
        return rounds

    assert asyncio.run(scenario()) == [("ns", "a"), ("ns", "a")]


def test_a_failing_round_does_not_stop_the_schedule() -> None:
    async def scenario() -> int:
        calls = 0

        async def sync(namespace: str, name: str) -> None:
            nonlocal calls
            calls += 1
            raise RuntimeError("the API server is away")

        schedule = SyncSchedule(sync)
        loop = asyncio.create_task(schedule.run(0.01))
        schedule.track("ns", "a", 1, serves=True)
        await asyncio.sleep(0.1)
        loop.cancel()
        await schedule.close()
        return calls

    errors = ERRORS.labels("adapters")._value.get()
    calls = asyncio.run(scenario())
    assert calls > 2 and ERRORS.labels("adapters")._value.get() - errors == calls


HANDLER_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("handler_var")


def test_every_round_runs_in_the_context_of_its_service_s_handler() -> None:
    """kopf.event needs the context variables kopf sets for an object's handlers: a round the
    interval starts (from the startup handler's task, which has none) must see them too."""

    async def scenario() -> list[str]:
        seen: list[str] = []

        async def sync(namespace: str, name: str) -> None:
            seen.append(HANDLER_VAR.get("none"))

        schedule = SyncSchedule(sync)
        loop = asyncio.create_task(schedule.run(0.01))  # started without the variable

        async def handler() -> None:  # as kopf runs a service's event handler
            HANDLER_VAR.set("the service's")
            schedule.track("ns", "a", 1, serves=True)

        await asyncio.create_task(handler())
        await asyncio.sleep(0.1)
        loop.cancel()
        await schedule.close()
        return seen

    seen = asyncio.run(scenario())
    assert len(seen) > 2 and set(seen) == {"the service's"}
