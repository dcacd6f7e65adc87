"""spec.loras applied to running workers, with no pod restart.

New pods read the list at start (the ConfigMap ``NAME-loras``, ``--lora-modules-file``): with
placement ``all`` they read every adapter's weights, with ``onDemand`` (``--lora-load lazy``)
they only learn each adapter's path and read it on its first request. Pods
already running are brought to the list through their admin endpoints: every ready pod's
adapters are read (``GET /v1/models``), the missing ones loaded, the ones no longer listed
unloaded. The spec is the whole list: an adapter loaded by hand and not in spec.loras is
unloaded too. Each round is idempotent, so a pod that failed (unreachable, a timeout) is simply
brought up to date by a later round. ``SyncSchedule`` runs the rounds: one at a time per
service, every ``LORA_SYNC_SECONDS`` and at once when its spec changes. It is the operator's
own loop, not a kopf timer: kopf puts a finalizer on every object with a timer, and an
InferenceService is meant to be deletable with the operator down (its children are
garbage-collected through their owner references).

A refused load (the worker's 400: rank too large, a missing file) is remembered per pod and
path and not retried for ``RETRY_REFUSED_SECONDS``: the same files would get the same answer.
It stays reported (status ``loras[].message``, the ``LoraLoadFailed`` condition) meanwhile.
A lazy worker's load is the same call and reads nothing (it never refuses); its failed reads
are read back from its server info instead and reported the same way, and an adapter counts
as held (``readyWorkers``) only where it is resident in a device slot.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import contextvars
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from radixserve_operator.kube import KubeApi
from radixserve_operator.manifests.lora import lora_modules
from radixserve_operator.manifests.meta import HTTP_PORT_NAME
from radixserve_operator.metrics import ERRORS
from radixserve_operator.spec import DEFAULT_PORT, SecretKeyRef, ServiceSpec
from radixserve_operator.status import LORA_LOAD_FAILED, lora_conditions, lora_status
from radixserve_operator.worker_api import (
    LoadRefused,
    WorkerEndpoint,
    WorkerUnreachable,
    adapter_residency,
    load_adapter,
    served_adapters,
    unload_adapter,
)

logger = logging.getLogger(__name__)

LORA_SYNC_SECONDS = 10.0  # the timer's interval: how soon a spec change reaches running pods
RETRY_REFUSED_SECONDS = 300.0
LORA_MODULES_FLAG = "--lora-modules-file"  # in the args of pods that read spec.loras' list


def serves_adapters(body: Mapping[str, Any]) -> bool:
    """Whether a service has adapters to sync, or an adapter status still to clear."""
    return bool((body.get("spec") or {}).get("loras")) or bool(
        (body.get("status") or {}).get("loras")
    )


class SyncSchedule:
    """The services to sync and their rounds. ``track`` is told of every event of a service:
    a new generation (a spec change) starts a round at once, status changes start none (the
    rounds write the status themselves); ``run`` starts one for every service each interval.
    A service never has two rounds at once; a change during a round gets one more after it.

    Every round of a service runs in a copy of the context its last ``track`` call ran in (a
    kopf handler of that service): ``kopf.event`` posts through context variables that kopf
    sets for each object's handlers, and a round started by ``run`` (a task of the startup
    handler's) would otherwise have none, its Events lost with a LookupError."""

    def __init__(self, sync: Callable[[str, str], Awaitable[None]]) -> None:
        self._sync = sync
        self._generations: dict[tuple[str, str], int | None] = {}
        self._contexts: dict[tuple[str, str], contextvars.Context] = {}
        self._rounds: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._again: set[tuple[str, str]] = set()

    def track(self, namespace: str, name: str, generation: int | None, serves: bool) -> None:
        key = (namespace, name)
        if not serves:
            self.forget(namespace, name)
            return
        self._contexts[key] = contextvars.copy_context()
        if key not in self._generations or self._generations[key] != generation:
            self._generations[key] = generation
            self._start(key)

    def forget(self, namespace: str, name: str) -> None:
        self._generations.pop((namespace, name), None)
        self._contexts.pop((namespace, name), None)

    async def run(self, interval: float) -> None:
        while True:
            for key in list(self._generations):
                self._start(key)
            await asyncio.sleep(interval)

    async def close(self) -> None:
        rounds = list(self._rounds.values())
        for task in rounds:
            task.cancel()
        for task in rounds:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _start(self, key: tuple[str, str]) -> None:
        if key in self._rounds:
            self._again.add(key)
            return
        self._rounds[key] = asyncio.create_task(self._rounds_of(key), context=self._contexts[key])

    async def _rounds_of(self, key: tuple[str, str]) -> None:
        try:
            while True:
                self._again.discard(key)
                try:
                    await self._sync(*key)
                except Exception:  # one service's failure is logged, the next round retries
                    ERRORS.labels("adapters").inc()
                    logger.exception(f"LoRA adapter sync of {key[0]}/{key[1]} failed")
                if key not in self._again or key not in self._generations:
                    return
        finally:
            self._rounds.pop(key, None)


@dataclass
class RefusedLoads:
    """Loads the workers refused, by (pod uid, adapter name, path): the message and when."""

    entries: dict[tuple[str, str, str], tuple[str, float]] = field(default_factory=dict)

    def due(self, key: tuple[str, str, str], now: float) -> bool:
        refused = self.entries.get(key)
        return refused is None or now - refused[1] >= RETRY_REFUSED_SECONDS

    def message(self, key: tuple[str, str, str]) -> str | None:
        refused = self.entries.get(key)
        return None if refused is None else refused[0]

    def record(self, key: tuple[str, str, str], message: str, now: float) -> None:
        self.entries[key] = (message, now)

    def forget(self, key: tuple[str, str, str]) -> None:
        self.entries.pop(key, None)

    def keep_pods(self, uids: Iterable[str]) -> None:
        """Drop what is known of pods that are gone (the memory stays bounded)."""
        alive = set(uids)
        for key in [key for key in self.entries if key[0] not in alive]:
            del self.entries[key]


@dataclass(frozen=True)
class WorkerAdapters:
    """One ready pod after a round: what it serves (``None``: not reached this round), the
    adapters it refused (name -> its message) and, on a lazy worker, those resident on its
    device (``None``: not asked, an eager worker's adapters are all read)."""

    endpoint: WorkerEndpoint
    held: dict[str, str] | None
    refused: dict[str, str]
    resident: frozenset[str] | None = None


def ready_workers(pods: Iterable[Mapping[str, Any]]) -> list[WorkerEndpoint]:
    """The pods that serve traffic (Ready, an IP, not terminating) and read the adapter list
    (started with ``--lora-modules-file``), at the worker container's ``http`` port. A pod not
    ready yet reads the list at start anyway; one started before LoRA was turned on cannot load
    adapters and is being replaced by the rollout that turned it on."""
    endpoints = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        ip = status.get("podIP")
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        if not ip or not ready or meta.get("deletionTimestamp") or not _reads_the_list(pod):
            continue
        host = f"[{ip}]" if ":" in ip else ip
        url = f"http://{host}:{_http_port(pod)}"
        endpoints.append(WorkerEndpoint(meta.get("name", "?"), meta.get("uid", ""), url))
    return sorted(endpoints, key=lambda endpoint: endpoint.pod)


def _reads_the_list(pod: Mapping[str, Any]) -> bool:
    return any(
        str(arg).startswith(LORA_MODULES_FLAG)
        for container in (pod.get("spec") or {}).get("containers") or []
        for arg in container.get("args") or []
    )


def _http_port(pod: Mapping[str, Any]) -> int:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == HTTP_PORT_NAME and port.get("containerPort"):
                return int(port["containerPort"])
    return DEFAULT_PORT


def plan(wanted: Mapping[str, str], held: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """What to load (name -> path: missing, or served from another path) and what to unload
    (served and not wanted)."""
    to_load = {name: path for name, path in wanted.items() if held.get(name) != path}
    return to_load, sorted(set(held) - set(wanted))


def read_admin_key(api: KubeApi, namespace: str, spec: ServiceSpec) -> str | None:
    """The key the workers' admin endpoints take: spec.env's admin key, else the API key's
    Secret (see ``ServiceSpec.admin_key``). A Secret is read by name (``get``, never list):
    the one the pods already get their key from."""
    source = spec.admin_key
    if not isinstance(source, SecretKeyRef):
        return source
    secret = api.read_secret(namespace, source.name)
    encoded = ((secret or {}).get("data") or {}).get(source.key)
    if encoded is None:
        return None  # not there (yet): the pods cannot start without it either
    try:
        return base64.b64decode(encoded).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


async def sync_workers(
    endpoints: list[WorkerEndpoint],
    key: str | None,
    wanted: Mapping[str, str],
    refused: RefusedLoads,
    now: float,
    lazy: bool = False,
) -> list[WorkerAdapters]:
    """One round over every ready pod at once; each pod's failures stay its own. ``lazy``:
    the pods read adapters on demand (their residency and failed reads are asked too)."""
    refused.keep_pods(endpoint.uid for endpoint in endpoints)
    async with aiohttp.ClientSession() as session:
        return list(
            await asyncio.gather(
                *(_sync_pod(session, e, key, wanted, refused, now, lazy) for e in endpoints)
            )
        )


async def _sync_pod(
    session: aiohttp.ClientSession,
    endpoint: WorkerEndpoint,
    key: str | None,
    wanted: Mapping[str, str],
    refused: RefusedLoads,
    now: float,
    lazy: bool,
) -> WorkerAdapters:
    refusals: dict[str, str] = {}
    resident: frozenset[str] | None = None
    try:
        held = await served_adapters(session, endpoint, key)
        to_load, to_unload = plan(wanted, held)
        for name in to_unload:
            await unload_adapter(session, endpoint, key, name)
            logger.info(f"unloaded LoRA adapter {name} from pod {endpoint.pod}")
            held.pop(name)
        for name, path in to_load.items():
            attempt = (endpoint.uid, name, path)
            if not refused.due(attempt, now):
                refusals[name] = refused.message(attempt) or ""
                continue
            try:
                await load_adapter(session, endpoint, key, name, path)
            except LoadRefused as error:
                message = f"pod {endpoint.pod}: {error.message}"
                refused.record(attempt, message, now)
                refusals[name] = message
                continue
            refused.forget(attempt)
            held[name] = path
            logger.info(f"loaded LoRA adapter {name} ({path}) on pod {endpoint.pod}")
        if lazy:
            residency = await adapter_residency(session, endpoint, key)
            resident = residency.resident
            for name, message in residency.failed.items():
                if name in wanted:
                    refusals.setdefault(name, f"pod {endpoint.pod}: {message}")
    except (WorkerUnreachable, LoadRefused) as error:
        ERRORS.labels("adapters").inc()
        logger.warning(f"LoRA adapters of pod {endpoint.pod} not synced this round: {error}")
        return WorkerAdapters(endpoint, None, refusals)
    return WorkerAdapters(endpoint, held, refusals, resident)


def adapter_status(
    previous: Mapping[str, Any], spec: ServiceSpec, workers: list[WorkerAdapters], now: str
) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """The status patch after a round (``loras`` and the conditions with ``LoraLoadFailed``)
    and the Events to post, as (type, reason, message): a Warning for each new refusal, a
    Normal one when the last is gone."""
    paths = lora_modules(spec.lora.adapters)
    wanted = [(a.name, a.source, paths[a.name]) for a in spec.lora.adapters]
    refused: dict[str, str] = {}
    for worker in workers:  # sorted by pod: the first pod's refusal of each adapter
        for name, message in worker.refused.items():
            refused.setdefault(name, message)
    held = [_holding(worker) for worker in workers if worker.held is not None]
    conditions = lora_conditions(previous, refused, now)
    status = {"loras": lora_status(wanted, held, refused), "conditions": conditions}
    old = _condition(previous.get("conditions"))
    new = _condition(conditions)
    events: list[tuple[str, str, str]] = []
    news = (old.get("status"), old.get("message")) != ("True", new["message"])
    if new["status"] == "True" and news:
        events.append(("Warning", LORA_LOAD_FAILED, new["message"]))
    elif new["status"] == "False" and old.get("status") == "True":
        events.append(("Normal", "LorasLoaded", "every worker took every adapter it was given"))
    return status, events


def _holding(worker: WorkerAdapters) -> dict[str, str]:
    """What a worker holds for ``readyWorkers``: every adapter it serves, or on a lazy worker
    those of them resident in a device slot (the others are only known)."""
    assert worker.held is not None
    if worker.resident is None:
        return worker.held
    return {name: path for name, path in worker.held.items() if name in worker.resident}


def _condition(conditions: Any) -> Mapping[str, Any]:
    return next((c for c in conditions or [] if c.get("type") == LORA_LOAD_FAILED), {})
