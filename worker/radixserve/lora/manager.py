"""`LoRAManager`: the adapters a server serves (name -> path), their host copies (an LRU of
`--max-cpu-loras`) and which device slot each holds (`--max-loras`), on the scheduler's thread.

Reading an adapter from disk is the slow part and runs on the manager's own thread: a request
whose adapter is neither on the device nor on the host waits in the queue while it is read, and
every other request keeps running. An adapter is served either read (`add`: checked before it
is served, --lora-load eager) or only known by its path (`register`, --lora-load lazy: read
on its first request, so a service may list more adapters than its hosts could hold). A read
that fails ends the requests waiting for it; the next request after `RETRY_FAILED_READ_SECONDS`
reads again (a Hub repo that was briefly unreachable is served once it is back). Moving a host
copy into a free slot (or the least recently used slot that no request holds) is a few queued
copies, done at admission. A slot a request holds is never given to another adapter.

Under tensor parallelism (`lockstep`) every rank must admit the same requests at the same step,
so no rank may see a read end at a moment of its own: reads then happen on the step loop, the
admin load's at its message and a dropped or lazy adapter's at the admission that needs it (the
step waits for one adapter's read), and a failed read is retried only when the adapter is
loaded again (a retry by the clock could come at different steps on different ranks).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import torch

from radixserve.layers.lora_linear import NO_ADAPTER
from radixserve.lora.adapter import LoRALoadError, LoRAWeights, read_adapter
from radixserve.lora.pool import LoRASlotPool
from radixserve.mem_cache.kv_event_sink import AdapterEventSink

logger = logging.getLogger(__name__)

RETRY_FAILED_READ_SECONDS = 30.0


@dataclass
class LoRACounters:
    """What the metrics report: loads from disk and their seconds, slot evictions, per adapter
    requests and tokens (prompt + generated)."""

    loads: int = 0
    load_seconds: float = 0.0
    evictions: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    prompt_tokens: dict[str, int] = field(default_factory=dict)
    generated_tokens: dict[str, int] = field(default_factory=dict)
    # prefix cache: per adapter ("" the base model), admissions and their cached tokens
    prefix_lookups: dict[str, int] = field(default_factory=dict)
    prefix_hit_tokens: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, adapter: str, n: int) -> None:
        counts = getattr(self, kind)
        counts[adapter] = counts.get(adapter, 0) + n


class LoRAManager:
    def __init__(
        self,
        pool: LoRASlotPool,
        max_cpu_loras: int,
        num_layers: int,
        shapes: dict[str, tuple[int, int]],
        dtype: torch.dtype,
        lockstep: bool = False,
    ) -> None:
        self.pool = pool
        self.lockstep = lockstep
        self.max_cpu_loras = max_cpu_loras
        self._read_args = (pool.max_rank, num_layers, shapes, dtype)
        self._pin = pool.batch.device.type == "cuda"
        self.paths: dict[str, str] = {}
        # a name's registration number: the prefix cache's namespace (a reloaded adapter
        # never reuses the KV its previous weights computed)
        self.uids: dict[str, int] = {}
        # a served uid's weights digest, once read: the disk KV tier's name for the adapter
        self._digests: dict[int, bytes] = {}
        self._next_uid = 1
        self._events: AdapterEventSink | None = None  # told of every uid's name (KV events)
        self.host: OrderedDict[str, LoRAWeights] = OrderedDict()
        self.reading: dict[str, Future[LoRAWeights]] = {}
        self.failed: dict[str, tuple[str, float]] = {}  # name -> why its read failed, when
        self.slot_names: list[str | None] = [None] * pool.slots
        self.slot_users = [0] * pool.slots
        self.slot_of: dict[str, int] = {}
        self._slot_used_at = [0.0] * pool.slots
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="lora-read")
        self._read_lock = threading.Lock()
        self.counters = LoRACounters()  # since the start (server info)
        self._delta = LoRACounters()  # since the last metrics report

    # -- what is served ------------------------------------------------------------------
    def read(self, path: str) -> LoRAWeights:
        """Read and check the adapter at `path` (any thread); LoRALoadError says why not."""
        start = time.perf_counter()
        weights = read_adapter(path, *self._read_args)
        if self._pin:
            weights.tensors = {
                k: (a.pin_memory(), b.pin_memory()) for k, (a, b) in weights.tensors.items()
            }
        seconds = time.perf_counter() - start
        with self._read_lock:  # the reading thread and the scheduler's count here
            for counters in (self.counters, self._delta):
                counters.loads += 1
                counters.load_seconds += seconds
        return weights

    def read_async(self, path: str) -> Future[LoRAWeights]:
        return self._executor.submit(self.read, path)

    def add(self, name: str, weights: LoRAWeights) -> None:
        """Serve `weights` as `name` (replacing what the name served: requests holding the
        old slot finish on it)."""
        self.register(name, weights.path)
        self._keep_on_host(name, weights)
        self._digests[self.uids[name]] = weights.digest

    def register(self, name: str, path: str) -> None:
        """Serve the adapter at `path` as `name` without reading it (replacing what the name
        served): its first request reads it, off the step loop, as it reads any adapter the
        host LRU dropped."""
        self.remove(name)
        self.paths[name] = path
        self.uids[name] = self._next_uid
        if self._events is not None:
            self._events.adapter_registered(self._next_uid, name)
        self._next_uid += 1

    def remove(self, name: str) -> bool:
        """Stop serving `name`; its slot is freed once no request holds it."""
        if name not in self.paths:
            return False
        del self.paths[name]
        uid = self.uids.pop(name)
        self._digests.pop(uid, None)
        if self._events is not None:
            self._events.adapter_retired(uid)
        self.host.pop(name, None)
        self.failed.pop(name, None)
        self.reading.pop(name, None)
        slot = self.slot_of.pop(name, None)
        if slot is not None and self.slot_users[slot] == 0:
            self.slot_names[slot] = None
        return True

    def publish_names(self, sink: AdapterEventSink) -> None:
        """Tell `sink` (the KV event publisher) the name of every uid served now and of every
        one loaded later, and which uids are retired by an unload or a reload: the cache keys
        paths by uid, events name adapters."""
        self._events = sink
        for name, uid in self.uids.items():
            sink.adapter_registered(uid, name)

    def served(self) -> dict[str, str]:
        return dict(self.paths)

    def uid(self, name: str | None) -> int:
        return 0 if name is None else self.uids[name]

    def identity(self, uid: int) -> bytes | None:
        """The digest of the weights a served uid stands for, None before they are read (the
        disk KV tier's key: stable across restarts and reloads, unlike the uid)."""
        return self._digests.get(uid)

    # -- slots ---------------------------------------------------------------------------
    def acquire(self, name: str) -> int | None:
        """The slot holding `name` for one more request, or None while it is being read (the
        request waits). Raises LoRALoadError when its read failed (within the last
        RETRY_FAILED_READ_SECONDS: later, it is read again)."""
        failure = self.failed.get(name)
        if failure is not None:
            if self.lockstep or time.monotonic() - failure[1] < RETRY_FAILED_READ_SECONDS:
                raise LoRALoadError(failure[0])
            del self.failed[name]
        slot = self.slot_of.get(name)
        if slot is None:
            weights = self._host_copy(name)
            if weights is None:
                return None
            slot = self._free_slot()
            if slot is None:
                return None  # every slot is in use: wait for one
            self.pool.write(slot, weights)
            self.slot_names[slot] = name
            self.slot_of[name] = slot
        self.slot_users[slot] += 1
        self._slot_used_at[slot] = time.monotonic()
        return slot

    def release(self, slot: int) -> None:
        if slot == NO_ADAPTER:
            return
        self.slot_users[slot] -= 1
        name = self.slot_names[slot]
        if self.slot_users[slot] == 0 and (name is None or self.slot_of.get(name) != slot):
            self.slot_names[slot] = None  # its adapter was unloaded or replaced meanwhile

    def resident(self) -> list[str]:
        return [n for n in self.slot_names if n is not None and self.slot_of.get(n) is not None]

    def _free_slot(self) -> int | None:
        empty = [s for s, n in enumerate(self.slot_names) if n is None]
        if empty:
            return empty[0]
        idle = [s for s in range(len(self.slot_names)) if self.slot_users[s] == 0]
        if not idle:
            return None
        slot = min(idle, key=self._slot_used_at.__getitem__)
        self.slot_of.pop(self.slot_names[slot], None)
        self.slot_names[slot] = None
        self.counters.evictions += 1
        self._delta.evictions += 1
        return slot

    def _host_copy(self, name: str) -> LoRAWeights | None:
        if name in self.host:
            self.host.move_to_end(name)
            return self.host[name]
        future = self.reading.get(name)
        if future is None:
            future = self.reading[name] = self.read_async(self.paths[name])
            if not self.lockstep:
                return None
            wait([future])  # every rank has the copy at this same admission
        if not future.done():
            return None
        del self.reading[name]
        try:
            weights = future.result()
        except LoRALoadError as exc:
            self.failed[name] = (str(exc), time.monotonic())
            raise
        self._keep_on_host(name, weights)
        self._digests[self.uids[name]] = weights.digest
        return weights

    def _keep_on_host(self, name: str, weights: LoRAWeights) -> None:
        self.host[name] = weights
        self.host.move_to_end(name)
        while len(self.host) > self.max_cpu_loras:
            self.host.popitem(last=False)

    # -- counters ------------------------------------------------------------------------
    def count_request(self, name: str, prompt_tokens: int) -> None:
        self._count("requests", name, 1)
        self._count("prompt_tokens", name, prompt_tokens)

    def count_tokens(self, name: str, generated: int) -> None:
        if generated > 0:
            self._count("generated_tokens", name, generated)

    def count_prefix(self, name: str | None, cached_tokens: int) -> None:
        self._count("prefix_lookups", name or "", 1)
        self._count("prefix_hit_tokens", name or "", cached_tokens)

    def _count(self, kind: str, adapter: str, n: int) -> None:
        self.counters.add(kind, adapter, n)
        self._delta.add(kind, adapter, n)

    def report(self, waiting: list[str]) -> dict:
        """The metrics report (metrics/lora.py): the adapters requests hold a slot of
        (running), those `waiting` for one, the slots, and the counters since the last report."""
        running = [n for s, n in enumerate(self.slot_names) if n and self.slot_users[s] > 0]
        with self._read_lock:
            delta, self._delta = self._delta, LoRACounters()
        return {
            "running": running,
            "waiting": waiting,
            "max_lora": self.pool.slots,
            "resident": sum(1 for n in self.slot_names if n is not None),
            "requests": delta.requests,
            "prompt_tokens": delta.prompt_tokens,
            "generated_tokens": delta.generated_tokens,
            "prefix_lookups": delta.prefix_lookups,
            "prefix_hit_tokens": delta.prefix_hit_tokens,
            "loads": delta.loads,
            "load_seconds": delta.load_seconds,
            "evictions": delta.evictions,
        }

    def info(self) -> dict:
        """Server info: what is served, resident and failed, and the counters."""
        c = self.counters
        return {
            "lora_adapters": self.served(),
            "lora_resident": self.resident(),
            # adapters whose last read failed, and why (--lora-load lazy: the operator's
            # LoraLoadFailed of an onDemand service)
            "lora_failed": {name: message for name, (message, _) in self.failed.items()},
            "max_loras": self.pool.slots,
            "max_lora_rank": self.pool.max_rank,
            "lora_loads": c.loads,
            "lora_load_seconds": c.load_seconds,
            "lora_evictions": c.evictions,
            "lora_requests": dict(c.requests),
            "lora_prompt_tokens": dict(c.prompt_tokens),
            "lora_generated_tokens": dict(c.generated_tokens),
            "lora_prefix_lookups": dict(c.prefix_lookups),
            "lora_prefix_hit_tokens": dict(c.prefix_hit_tokens),
        }

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
