"""The scheduling policy: continuous batching over a radix prefix cache.

Each `step()` it (1) admits waiting requests into a prefill batch (policy order, PrefillAdder
budgets, chunked prefill) or, when none can start, advances the running batch by one decode step
(retracting requests if KV runs out), (2) launches the batch on the model worker it was given
and (3) resolves the batch launched before: appends sampled tokens, checks stops, caches
finished requests' KV in the radix tree and queues output deltas. Requests and aborts arrive by
method calls (`dispatch`). The process, its sockets and tensor parallelism are
scheduler_process.py's; statistics are scheduler_stats.py's. The worker is anything with the
`BatchWorker` shape, so the policy runs in tests with a fake worker and no model.

Constrained requests (json_schema, regex, ebnf) wait in `grammar_queue` while their grammar
compiles beside the loop (the grammar cache's worker processes, within its limits), and join the
waiting queue once it has: the loop never waits for a compile. A batch with constrained rows is launched in two parts: its forward first,
then, once the batch before it has been resolved and every matcher has accepted its row's last
token, its sampling with the rows' masks (`BatchWorker.sample_deferred`). With overlap, the
device runs the forward while the host resolves the previous batch: the matchers accept that
batch's tokens first, in one call, and the masks are then filled on the grammar backend's
thread while this one appends that batch's tokens, checks its stops and emits its outputs.

A request that breaks code working for it alone (taking it in, its part of a prefill batch: its
prefix match, its admission, its sampling tensors; its output: stop checks, logprobs) ends alone
with an internal error (`internal_error`: a 500 at the front end), freed as an abort is, and
the batch goes on without it. A prefill batch that fails to form is undone (nothing is
allocated before its per-request inputs are built) and formed once per request to find the
culprit: only on that failure path. A failure no single request causes (the forward itself)
still propagates.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from radixserve.boundary import (
    AbortReq,
    FlushCacheReq,
    FlushCacheReqOutput,
    GetServerInfoReq,
    GetServerInfoReqOutput,
    GrammarsReadyReq,
    LoRAAdapterReq,
    LoRAAdapterReqOutput,
    ReqOutput,
    SchedulerStats,
    TokenizedGenerateReqInput,
    TokenLogprob,
)
from radixserve.catalog.model_tasks import ModelTask
from radixserve.constrained.base_grammar_backend import GrammarBackend, GrammarError
from radixserve.constrained.grammar_cache import GrammarCache
from radixserve.forward.mode import ForwardMode
from radixserve.gc_pauses import pause_stats
from radixserve.lora.adapter import LoRALoadError
from radixserve.mem_cache.chunk_cache import ChunkCache
from radixserve.mem_cache.kv_events import KVEventPublisher
from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.mem_cache.tiered_cache import TieredRadixCache, build_tiered_cache
from radixserve.model_executor.pooler import finish_embedding
from radixserve.scheduler.schedule_batch import NO_LORA_SLOT, Req, ScheduleBatch
from radixserve.scheduler.schedule_policy import AddResult, PrefillAdder, SchedulePolicy
from radixserve.scheduler.scheduler_stats import SchedulerCounters
from radixserve.speculative.speculator import Speculator, build_proposer

if TYPE_CHECKING:
    import torch

    from radixserve.forward.worker_batch import ModelWorkerBatch
    from radixserve.lora.manager import LoRAManager
    from radixserve.mem_cache.allocator import TokenSlotAllocator
    from radixserve.mem_cache.base_prefix_cache import BasePrefixCache
    from radixserve.mem_cache.memory_pool import ReqToTokenPool
    from radixserve.sampling.sampling_batch_info import SamplingBatchInfo
    from radixserve.scheduler.tp_worker import (
        GenerationBatchResult,
        GpuTimeline,
        PendingBatchResult,
    )
    from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)

# new_token_ratio: raised after a retraction (admit less optimistically), then decays back.
RETRACT_RATIO_STEP = 0.15
RATIO_DECAY_PER_STEP = 0.002
# an internal error's message keeps this much of the exception's text
INTERNAL_ERROR_MESSAGE_CHARS = 200


def internal_error(exc: Exception) -> dict[str, Any]:
    """The finished reason of a request that scheduler code working for it alone raised on:
    no `param`, so the front end answers 500 (the server's fault, not the request's)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = text[:INTERNAL_ERROR_MESSAGE_CHARS]
    message = f"internal error: {type(exc).__name__}" + (f": {text}" if text else "")
    return {"type": "error", "message": message}


class BatchWorker(Protocol):
    """What the policy needs of a model worker (scheduler/tp_worker.py's ModelWorker): the
    memory it allocates from, and `launch`, which returns at once with a pending result."""

    req_to_token_pool: ReqToTokenPool
    allocator: TokenSlotAllocator
    kv_pool: Any  # the device KV buffers, whatever their layout (the host KV tier mirrors them)
    max_total_tokens: int
    max_running_requests: int
    device: torch.device
    # launch returns before the device has run the batch: the next batch can form meanwhile
    asynchronous: bool
    timeline: GpuTimeline
    lora: LoRAManager | None  # None: no LoRA adapters served

    def launch(self, batch: ModelWorkerBatch) -> PendingBatchResult:
        """Launch the batch's forward and, unless it has constrained rows, its sampling (see
        PendingBatchResult.awaits_sampling)."""
        ...

    def sample_deferred(self, pending: PendingBatchResult) -> None:
        """Launch the sampling of a batch whose rows' grammars are now up to date."""
        ...

    def describe(self) -> dict[str, Any]:
        """Device, dtype and backend, for server info."""
        ...


@dataclass(frozen=True)
class ServedModel:
    """What the policy needs of the model: limits to validate and stop requests by."""

    context_len: int
    vocab_size: int
    eos_token_ids: frozenset[int]
    tokenizer: Any = None  # decodes output tails for stop strings; grammars are built on it
    description: str = ""
    matmul_parameters: int = 0
    # generate, or embed/rerank: pool each request's prefill instead of sampling
    task: ModelTask = ModelTask()

    def grammar_backend(self) -> GrammarBackend:
        """The backend constrained requests compile on, built by the grammar cache at the first
        of them (it reads the whole vocabulary); xgrammar is imported only then, so a worker
        that never sees a constraint never loads it."""
        from radixserve.constrained.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(self.tokenizer, self.vocab_size, self.eos_token_ids)


@dataclass
class LaunchedBatch:
    """What resolving a launched batch needs, frozen at launch (the ScheduleBatch moves on)."""

    reqs: list[Req]
    mode: ForwardMode
    chunked_req: Req | None
    num_tokens: int
    pending: PendingBatchResult
    start: float


class Scheduler:
    def __init__(self, server_args: ServerArgs, worker: BatchWorker, model: ServedModel) -> None:
        self.server_args = server_args
        self.model = model
        self.eos_token_ids = model.eos_token_ids
        self.worker = worker
        self.max_total_tokens = worker.max_total_tokens
        self.max_running_requests = worker.max_running_requests
        self.context_len = model.context_len
        # mean pooling needs every prompt token's hidden state: no prefix can be reused
        mean_pooling = model.task.pools and model.task.pooling == "mean"
        cache_cls = ChunkCache if server_args.disable_radix_cache or mean_pooling else RadixCache
        if server_args.kv_host_memory is not None and cache_cls is RadixCache:
            self.tree_cache: BasePrefixCache = build_tiered_cache(
                server_args, worker.req_to_token_pool, worker.allocator, worker.kv_pool
            )
        else:
            self.tree_cache = cache_cls(worker.req_to_token_pool, worker.allocator)
        self.policy = SchedulePolicy(server_args.schedule_policy, self.tree_cache)

        self.waiting_queue: list[Req] = []
        # constrained requests whose grammar is compiling, in arrival order
        self.grammar_queue: list[Req] = []
        self.grammar_cache = (
            GrammarCache(
                model.grammar_backend,
                max_bytes=server_args.grammar_cache_mb << 20,
                timeout=server_args.grammar_compile_timeout,
                max_concurrent=server_args.max_concurrent_grammar_compiles,
            )
            if model.tokenizer is not None
            else None
        )
        # with tensor parallelism rank 0 decides when a compile is done and tells every rank
        # (GrammarsReadyReq), so that all ranks admit the request in the same step
        self.polls_grammars = server_args.tp_size == 1
        self.running_batch = self._new_batch([])
        self.chunked_req: Req | None = None
        self.last_batch: ScheduleBatch | None = None  # the batch launched last
        self.in_flight: LaunchedBatch | None = None  # launched, not yet resolved (overlap)
        self.admission_deferred_steps = 0  # steps a prefill has waited for free slots
        # with an asynchronous worker the next batch forms while this one runs
        self.overlap = worker.asynchronous and not server_args.disable_overlap
        self.reqs_by_rid: dict[str, Req] = {}
        self.outputs: list[ReqOutput] = []
        self.new_token_ratio = server_args.new_token_ratio
        self.counters = SchedulerCounters()
        # speculative decoding (off: None, and the decode path is untouched)
        self.speculator = (
            Speculator(
                server_args,
                build_proposer(server_args, self.max_running_requests),
                self.context_len,
            )
            if server_args.speculative_method is not None
            else None
        )
        self.kv_events: KVEventPublisher | None = None
        self.lora: LoRAManager | None = getattr(worker, "lora", None)
        if self.lora is not None and isinstance(self.tree_cache, TieredRadixCache):
            self.tree_cache.adapter_identity = self.lora.identity  # disk blocks by weights
        # admin loads being read on the LoRA manager's thread (pop_replies answers them)
        self._lora_loads: list[tuple[LoRAAdapterReq, concurrent.futures.Future]] = []
        self._load_start_up_adapters(server_args)

    def _load_start_up_adapters(self, server_args: ServerArgs) -> None:
        """--lora-modules and --lora-modules-file. A bad adapter of the flag fails the start;
        one of the file (the operator's list, which a running service's workers are also asked
        to load, where a refusal becomes the service's condition) is logged and left out, so one
        bad adapter in spec.loras never keeps the service's new pods from starting. With
        --lora-load lazy nothing is read: each is registered and read on its first request."""
        flagged = {module.partition("=")[0] for module in server_args.lora_modules or []}
        for name, path in server_args.lora_module_paths().items():
            assert self.lora is not None
            if server_args.lora_load == "lazy":
                self.lora.register(name, path)
                continue
            try:
                self.lora.add(name, self.lora.read(path))
            except LoRALoadError as exc:
                if name in flagged:
                    raise
                logger.warning("LoRA adapter %s of --lora-modules-file not served: %s", name, exc)

    def publish_kv_events(self, publisher: KVEventPublisher) -> None:
        """Make `publisher` the prefix cache's event sink (rank 0, --kv-events-endpoint)."""
        assert isinstance(self.tree_cache, RadixCache), "KV events need the radix cache"
        self.kv_events = publisher
        if self.lora is not None:  # before the cache's first update under an adapter
            self.lora.publish_names(publisher)
        self.tree_cache.event_sink = publisher

    # -- requests ----------------------------------------------------------------------------
    def handle_generate_request(self, recv: TokenizedGenerateReqInput) -> None:
        req = Req(
            recv.rid,
            recv.input_ids,
            recv.sampling_params,
            return_logprob=recv.return_logprob,
            top_logprobs_num=recv.top_logprobs_num,
            stream=recv.stream,
            arrival_time=recv.arrival_time or None,
            eos_token_ids=self.eos_token_ids,
            pooling=recv.pooling,
            lora_name=recv.lora_name,
        )
        error = self._validate(req)
        if error is not None:
            req.finished_reason = {"type": "error", "message": error}
            self._emit(req)
            return
        self.reqs_by_rid[req.rid] = req
        constraint = req.sampling_params.constraint
        if constraint is None:
            self.waiting_queue.append(req)
            return
        if self.grammar_cache is None:
            kind = constraint[0]
            req.finished_reason = {
                "type": "error",
                "message": f"{kind} needs the model's tokenizer, and this model has none",
                "param": kind,
            }
            self._finish_waiting(req)
            return
        req.grammar_future = self.grammar_cache.get(*constraint)
        self.grammar_queue.append(req)

    def _refuse_request(self, recv: TokenizedGenerateReqInput, exc: Exception) -> None:
        """Taking a request in raised: forget whatever of it was queued (it holds nothing
        yet) and answer it with an internal error."""
        logger.error("request %s failed in the scheduler; ending it alone", recv.rid, exc_info=exc)
        req = self.reqs_by_rid.pop(recv.rid, None)
        for queue in (self.waiting_queue, self.grammar_queue):
            if req is not None and req in queue:
                queue.remove(req)
        self.outputs.append(
            ReqOutput(
                rid=recv.rid,
                new_token_ids=[],
                finished_reason=internal_error(exc),
                prompt_tokens=len(recv.input_ids),
                completion_tokens=0,
                cached_tokens=0,
            )
        )

    def _validate(self, req: Req) -> str | None:
        if req.lora_name is not None:
            if self.lora is None or req.lora_name not in self.lora.paths:
                return f"the LoRA adapter {req.lora_name!r} is not served"
            req.lora_uid = self.lora.uid(req.lora_name)
            self.lora.count_request(req.lora_name, len(req.origin_input_ids))
        return self._validate_params(req)

    def _validate_params(self, req: Req) -> str | None:
        n = len(req.origin_input_ids)
        if n == 0:
            return "the prompt is empty"
        if n >= self.context_len:
            return f"the prompt has {n} tokens; the model's context length is {self.context_len}"
        if n + 1 > self.max_total_tokens:
            return f"the prompt has {n} tokens; the KV cache holds {self.max_total_tokens}"
        if any(t < 0 or t >= self.model.vocab_size for t in req.origin_input_ids):
            return f"input ids must be in [0, {self.model.vocab_size})"
        task = self.model.task.task
        if req.pooling is not None and not self.model.task.pools:
            return "this model generates text; it makes no embeddings or scores"
        if req.pooling is None and self.model.task.pools and req.sampling_params.max_new_tokens:
            return f"this model serves --task {task}; it does not generate text"
        return None

    def abort_request(self, rid: str) -> None:
        req = self.reqs_by_rid.get(rid)
        if req is None or req.finished():
            return
        queue = next((q for q in (self.waiting_queue, self.grammar_queue) if req in q), None)
        if queue is not None:
            queue.remove(req)
            if queue is self.grammar_queue:
                # the compile is cancelled unless another request still waits for it
                self.grammar_cache.release(*req.sampling_params.constraint)
                req.grammar_future = None
            req.finished_reason = {"type": "abort"}
            self._finish_waiting(req)
        else:
            # running or mid-chunk: freed at the next step boundary
            req.finished_reason = {"type": "abort"}

    def _finish_waiting(self, req: Req) -> None:
        self.reqs_by_rid.pop(req.rid, None)
        self._emit(req)

    # -- grammars ----------------------------------------------------------------------------
    def ready_grammar_rids(self) -> list[str]:
        """Requests whose grammar compile has ended (compiled or failed); never waits."""
        return [r.rid for r in self.grammar_queue if r.grammar_future.done()]

    def grammar_failures(self, rids: list[str]) -> dict[str, dict[str, Any]]:
        """The finished_reason of each of these requests whose compile failed (ended: rank 0
        passes them on in its GrammarsReadyReq)."""
        chosen = set(rids)
        failures = {}
        for req in self.grammar_queue:
            if req.rid in chosen and (reason := self._compile_failure(req)) is not None:
                failures[req.rid] = reason
        return failures

    def _compile_failure(self, req: Req) -> dict[str, Any] | None:
        """Waits for the request's compile; its error as a finished_reason, None if it
        compiled."""
        kind = req.sampling_params.constraint[0]
        try:
            req.grammar_future.result()
        except GrammarError as exc:
            message = f"{kind} cannot be compiled: {exc}"
            return {"type": "error", "message": message, "param": kind}
        except Exception as exc:  # the backend itself failed: not the client's fault
            logger.exception("grammar backend failed on a %s", kind)
            return {"type": "error", "message": f"{kind}: {exc}"}
        return None

    def admit_grammars(self, rids: list[str], failed: dict[str, dict] | None = None) -> None:
        """Move these requests to the waiting queue with a fresh matcher each, or finish them
        with the compile's error: `failed`'s, when rank 0 says (with --tp-size > 1 every rank
        takes rank 0's verdict; a rank's own compile, still running, is then released). Waits
        for compiles still running: only a rank following rank 0 can be behind it."""
        chosen = set(rids)
        ready = [r for r in self.grammar_queue if r.rid in chosen]
        if not ready:
            return
        self.grammar_queue = [r for r in self.grammar_queue if r.rid not in chosen]
        for req in ready:
            if failed is not None and req.rid in failed:
                req.finished_reason = failed[req.rid]
                self.grammar_cache.release(*req.sampling_params.constraint)
            else:
                req.finished_reason = self._compile_failure(req)
                if req.finished_reason is None:
                    req.grammar = req.grammar_future.result().new_grammar()
            req.grammar_future = None
            if req.finished():
                self._finish_waiting(req)
            else:
                self.waiting_queue.append(req)

    def waiting_only_in_background(self) -> bool:
        """Nothing can run until a grammar compile or an adapter read ends, both on other
        threads (the process loop then waits, not spins: a spinning loop also holds the GIL the
        reading thread needs)."""
        if self._is_running():
            return False
        if not self.waiting_queue:
            return bool(self.grammar_queue)
        reading = self.lora.reading if self.lora is not None else {}
        return all(
            r.lora_slot == NO_LORA_SLOT and r.lora_name in reading for r in self.waiting_queue
        )

    def wait_in_background(self, timeout: float) -> None:
        """Block until a pending compile or adapter read ends (or `timeout` seconds): for an
        in-process driver with nothing else to do, instead of spinning through empty steps."""
        pending = [r.grammar_future for r in self.grammar_queue]
        if self.lora is not None:
            pending.extend(self.lora.reading.values())
        if pending:
            concurrent.futures.wait(pending, timeout, concurrent.futures.FIRST_COMPLETED)

    def flush_cache(self) -> bool:
        if self.in_flight is None:
            # the last batch may still await absorption although every request has finished
            self._absorb_last_batch()
            self._drop_finished_running()
        if self.has_work():
            return False
        self.tree_cache.reset()
        self.worker.allocator.clear()
        self.worker.req_to_token_pool.clear()
        return True

    def get_server_info(self) -> dict[str, Any]:
        return {
            "model": self.server_args.model,
            "model_description": self.model.description,
            **self.worker.describe(),
            "max_total_tokens": self.max_total_tokens,
            "max_running_requests": self.max_running_requests,
            "context_len": self.context_len,
            "vocab_size": self.model.vocab_size,
            "chunked_prefill_size": self.server_args.chunked_prefill_size,
            "schedule_policy": self.server_args.schedule_policy,
            "radix_cache": not self.server_args.disable_radix_cache,
            "kv_events_endpoint": self.server_args.kv_events_endpoint,
            "kv_events_replay_endpoint": self.server_args.kv_events_replay_endpoint,
            "kv_events_block_size": self.server_args.kv_events_block_size,
            "num_running_requests": len(self.running_batch),
            "num_queued_requests": len(self.waiting_queue) + len(self.grammar_queue),
            "num_compiling_grammars": len(self.grammar_queue),
            "grammar_cache_entries": 0,
            "grammar_cache_bytes": 0,
            **(self.grammar_cache.stats() if self.grammar_cache is not None else {}),
            **self.counters.info(),
            "kv_cache_usage_ratio": self.kv_usage(),
            "kv_cache_evictable_ratio": self.kv_evictable(),
            "free_slots": self.worker.allocator.available_size(),
            "evictable_size": self.tree_cache.evictable_size(),
            "protected_size": self.tree_cache.protected_size(),
            "new_token_ratio": self.new_token_ratio,
            "overlap": self.overlap,
            "gpu_busy_ms": self.worker.timeline.busy_ms,
            "gpu_gap_ms": self.worker.timeline.gap_ms,
            "gpu_decode_busy_ms": self.worker.timeline.decode_busy_ms,
            "gpu_decode_gap_ms": self.worker.timeline.decode_gap_ms,
            "gpu_busy_ms_by_mode": dict(self.worker.timeline.busy_ms_by_mode),
            "gpu_gap_ms_before_mode": dict(self.worker.timeline.gap_ms_before_mode),
            "gpu_gap_count_before_mode": dict(self.worker.timeline.gap_count_before_mode),
            "gpu_longest_gaps_ms_before_mode": {
                mode: list(gaps)
                for mode, gaps in self.worker.timeline.longest_gaps_ms_before_mode.items()
            },
            "gpu_tokens_by_mode": dict(self.worker.timeline.tokens_by_mode),
            **pause_stats(),  # this process's garbage collections (gc_pauses.py)
            "matmul_parameters": self.model.matmul_parameters,
            "speculative_method": self.server_args.speculative_method,
            **(self.speculator.info() if self.speculator is not None else {}),
            **(self.lora.info() if self.lora is not None else {}),
        }

    def change_lora_adapters(
        self, msg: LoRAAdapterReq, wait: bool = True
    ) -> LoRAAdapterReqOutput | None:
        """Load or unload an adapter (the admin endpoints). A load that cannot be served fails
        alone: nothing served changes. With `wait` False a load is read and checked on the
        LoRA manager's thread while the steps go on: None now, its reply from `pop_replies`.
        With --lora-load lazy a load only registers the path (read on its first request)."""
        if self.lora is None:
            message = "LoRA is off: start the server with --max-loras"
            return LoRAAdapterReqOutput(False, message, req_id=msg.req_id)
        if msg.path is None:
            if not self.lora.remove(msg.name):
                message = f"the LoRA adapter {msg.name!r} is not loaded"
                return LoRAAdapterReqOutput(False, message, self.lora.served(), msg.req_id)
            return LoRAAdapterReqOutput(True, "", self.lora.served(), msg.req_id)
        if self.server_args.lora_load == "lazy":  # known now, read on its first request
            self.lora.register(msg.name, msg.path)
            return LoRAAdapterReqOutput(True, "", self.lora.served(), msg.req_id)
        future = self.lora.read_async(msg.path)
        if not wait:
            self._lora_loads.append((msg, future))
            return None
        concurrent.futures.wait([future])
        return self._finish_lora_load(msg, future)

    def _finish_lora_load(
        self, msg: LoRAAdapterReq, future: concurrent.futures.Future
    ) -> LoRAAdapterReqOutput:
        assert self.lora is not None
        try:
            self.lora.add(msg.name, future.result())
        except LoRALoadError as exc:
            return LoRAAdapterReqOutput(False, str(exc), self.lora.served(), msg.req_id)
        return LoRAAdapterReqOutput(True, "", self.lora.served(), msg.req_id)

    def pop_replies(self) -> list[LoRAAdapterReqOutput]:
        """The replies of adapter loads whose read has ended (never waits)."""
        if not self._lora_loads:
            return []
        # one look at each future: one that ends between two looks would be in neither list
        done, reading = [], []
        for load in self._lora_loads:
            (done if load[1].done() else reading).append(load)
        self._lora_loads = reading
        return [self._finish_lora_load(m, f) for m, f in done]

    def kv_usage(self) -> float:
        """KV held by running or queued requests: neither free nor evictable prefix cache
        (an idle, warm pod reads 0, however much it has cached)."""
        free = self.worker.allocator.available_size() + self.tree_cache.evictable_size()
        return 1.0 - free / self.max_total_tokens

    def kv_evictable(self) -> float:
        """The cached prefixes no request pins: reclaimable at once when needed."""
        return self.tree_cache.evictable_size() / self.max_total_tokens

    def reset_statistics(self) -> None:
        """Forget counters and device timings so far (after the start-up warm-up)."""
        self.counters = SchedulerCounters()
        self.worker.timeline.reset()

    def has_work(self) -> bool:
        return bool(self.grammar_queue) or self._has_runnable_work()

    def _has_runnable_work(self) -> bool:
        return bool(self.waiting_queue) or self._is_running()

    def _is_running(self) -> bool:
        """Requests are decoding or prefilling, or a batch is yet to be resolved."""
        return bool(
            self.running_batch.reqs or self.chunked_req or self.in_flight or self.last_batch
        )

    # -- one iteration -----------------------------------------------------------------------
    def step(self) -> bool:
        """One iteration: form the next batch and launch it, then resolve the batch before it.

        With overlap the device runs batch N+1 while the host resolves batch N (and forms N+2);
        without it (or on the CPU, where nothing runs asynchronously) a batch is resolved right
        after its launch. False when nothing was launched or resolved.
        """
        if self.polls_grammars and self.grammar_queue:
            self.admit_grammars(self.ready_grammar_rids())
        if self.in_flight is not None and self._proposals_need_tokens():
            # a proposer reads the requests' tokens: the batch in flight is resolved first
            previous, self.in_flight = self.in_flight, None
            self._resolve(previous)
        batch = self.get_next_batch_to_run()
        launched = self._launch(batch) if batch is not None else None
        # constrained rows: their masks are filled once their grammars have accepted the
        # previous batch's tokens (so they follow what was really sampled), beside the rest of
        # resolving it
        masked = batch.sampling_info if launched and launched.pending.awaits_sampling else None
        previous, self.in_flight = self.in_flight, None
        if previous is not None:
            self._resolve(previous, masked)
        elif masked is not None:
            masked.start_grammar_mask()
        if launched is not None:
            if masked is not None:
                self.worker.sample_deferred(launched.pending)
            if self.overlap:
                self.in_flight = launched
            else:
                self._resolve(launched)
        if batch is None:
            self.worker.timeline.mark_idle()
        return batch is not None or previous is not None

    def _proposals_need_tokens(self) -> bool:
        """Whether the next step may speculate, so that the in-flight batch must be resolved
        before it forms: the proposals continue the requests' last tokens, and a verify step's
        rejected KV is given back on resolving it. Speculation off, or a batch too large to
        speculate, keeps overlap."""
        if self.speculator is None:
            return False
        flight = self.in_flight
        joining = flight.reqs if flight.mode.is_extend() else []
        return flight.mode.is_verify() or self.speculator.may_propose(
            self.running_batch.reqs + joining
        )

    def _launch(self, batch: ScheduleBatch) -> LaunchedBatch:
        start = time.perf_counter()
        worker_batch = batch.get_model_worker_batch(self.lora is not None)
        # the KV tiers' restores of this admission round start now, beside the pass
        restore = self.tree_cache.take_restore()
        if restore is not None:
            worker_batch = replace(worker_batch, kv_restore=restore)
        pending = self.worker.launch(worker_batch)
        for i, req in enumerate(batch.reqs):
            if batch.forward_mode.is_decode() or req is not self.chunked_req:
                req.future_id = pending.future.placeholder(i)
        self.last_batch = batch
        return LaunchedBatch(
            reqs=list(batch.reqs),
            mode=batch.forward_mode,
            chunked_req=self.chunked_req if batch.forward_mode.is_extend() else None,
            num_tokens=int(batch.input_ids.numel()),
            pending=pending,
            start=start,
        )

    def _resolve(self, launched: LaunchedBatch, masked: SamplingBatchInfo | None = None) -> None:
        """Append the batch's tokens and check its requests' stops, then emit and release them.
        `masked`, the next batch's sampling state when it has constrained rows, starts its mask
        fill as soon as every matcher has accepted its row's token: the constrained rows'
        accepts come first, in one call (`_accept_grammar_tokens`), and the fill then runs on
        the grammar backend's thread while this one appends, checks and emits, which touches no
        matcher (`is_terminated` answers from what the accepts recorded). So only the accepts
        and the fill lie between this batch's tokens and the next batch's sampling."""
        result = launched.pending.resolve()
        self.worker.timeline.add(launched.pending, launched.mode.metric_label, launched.num_tokens)
        elapsed = time.perf_counter() - launched.start
        self.counters.count_step(
            launched.mode.metric_label, len(launched.reqs), launched.num_tokens, elapsed
        )
        taking: list[tuple[int, Req]] = []  # (row, request) of the rows this result is for
        for i, req in enumerate(launched.reqs):
            if req is launched.chunked_req:
                if req.pooling is not None and result.pooled is not None:
                    self._add_pooled(req, result.pooled[i])
                continue  # an intermediate chunk samples nothing
            if req.future_id == launched.pending.future.placeholder(i):
                req.future_id = None
            if req.finished():
                # finished earlier (an overlap step past the end) or aborted meanwhile
                if req.req_pool_idx is not None:
                    self._release_finished(req)
                continue
            taking.append((i, req))
        verdicts = self._accept_grammar_tokens(launched, result, taking)
        if masked is not None and verdicts is not None:
            masked.start_grammar_mask()
        resolved: list[Req] = []
        for i, req in taking:
            try:
                if req.pooling is not None and result.pooled is not None:
                    self._finish_pooling(req, result.pooled[i])
                elif self._takes_token(launched, req, result):
                    self._append_token(req, result, i, verdicts)
                req.check_finished(self.context_len, self.model.tokenizer)
            except Exception as exc:  # this request's own output (its stops, its logprobs)
                self._end_with_internal_error(req, exc)
            resolved.append(req)
        if masked is not None and verdicts is None:
            masked.start_grammar_mask()
        for req in resolved:
            if not req.finished():
                try:
                    self._emit(req)
                    continue
                except Exception as exc:
                    self._end_with_internal_error(req, exc)
            if req.req_pool_idx is not None:
                self._release_finished(req)
            else:  # retracted while this batch ran, and that token was its last
                self.waiting_queue.remove(req)
                self._finish_waiting(req)

    def get_next_batch_to_run(self) -> ScheduleBatch | None:
        self._absorb_last_batch()
        self._drop_finished_running()
        prefill = self.get_new_batch_prefill()
        if prefill is not None:
            running = self.running_batch
            if (
                self.server_args.enable_mixed_chunk
                and running.reqs
                and running.decode_slots_short() == 0
            ):
                prefill.mix_with_running(running)
                self.running_batch = self._new_batch([])
            return prefill
        if not self.running_batch.reqs:
            return None
        return self.update_running_batch()

    def _absorb_last_batch(self) -> None:
        """Requests of the last extend pass join the running batch; a chunked one instead caches
        the chunk it computed and waits for its next chunk. Done here, not when results arrive,
        because with overlap the next batch forms before the last one's tokens are known."""
        last, self.last_batch = self.last_batch, None
        if last is None or not last.forward_mode.is_extend():
            return
        chunked = self.chunked_req
        if chunked is not None and chunked in last.reqs:
            if chunked.finished():  # aborted mid-prompt
                self.chunked_req = None
                self._release_finished(chunked)
            else:
                self.tree_cache.cache_unfinished_req(chunked)
        # a pooling request ends with its prefill: it never decodes
        last.filter_batch(
            [i for i, r in enumerate(last.reqs) if r is not chunked and r.pooling is None]
        )
        if last.forward_mode.is_mixed() or not self.running_batch.reqs:
            self.running_batch = last
        else:
            self.running_batch.merge_batch(last)

    def _drop_finished_running(self) -> None:
        batch = self.running_batch
        gone = {i for i, r in enumerate(batch.reqs) if r.finished()}
        if not gone:
            return
        for i in gone:
            if batch.reqs[i].req_pool_idx is not None:
                self._release_finished(batch.reqs[i])
        batch.filter_batch([i for i in range(len(batch.reqs)) if i not in gone])

    def get_new_batch_prefill(self) -> ScheduleBatch | None:
        if self.lora is not None:
            self._end_failed_lora_waits()
        if not self.waiting_queue and self.chunked_req is None:
            return None
        running = len(self.running_batch)
        if running >= self.max_running_requests and self.chunked_req is None:
            return None
        if self.chunked_req is None and self._defer_admission(running):
            return None
        try:
            adder, batch = self._form_prefill(self.waiting_queue, self.chunked_req)
        except Exception:
            # One request's own parameters can break the whole batch (its prefix match, its
            # sampling tensors: torch.tensor([2**63]) overflows). Nothing was allocated and the
            # locks are undone: find it by forming a batch of each request alone, end it with an
            # internal error, and form the batch without it. A failure that no single request
            # causes is not the policy's to hide.
            if not self._end_requests_that_fail_alone():
                raise
            return self.get_new_batch_prefill()
        if batch is None:
            return None
        admitted = {id(r) for r in adder.can_run_list}
        self.waiting_queue = [r for r in self.waiting_queue if id(r) not in admitted]
        for req in adder.can_run_list:
            if (
                req is not self.chunked_req
                and req.num_retractions == 0
                and req.first_scheduled_time is None
            ):
                req.cached_tokens = len(req.prefix_indices)
                self.counters.count_prefix_lookup(
                    len(req.origin_input_ids), req.cached_tokens, req.restored_tokens
                )
                if self.lora is not None:
                    self.lora.count_prefix(req.lora_name, req.cached_tokens)
        self.chunked_req = adder.new_chunked_req
        batch.allocate_for_extend()
        self.counters.count_prefill(sum(batch.extend_lens))
        return batch

    def _defer_admission(self, running: int) -> bool:
        """Whether the prefill that could run now waits for more request slots to free up
        (`--min-admission-batch`). A saturated server frees a slot or two a decode step; each
        admission pass is an eager launch of every layer (~30 ms of host time at the 8B shape,
        about its device time for two prompts), so one such pass a step left the device idle
        between passes (offline 8B: 497 passes of 1,300 tokens, 7% idle before them, H200
        2026-12-04). Only while requests queue beyond the free slots, and for at most as many
        steps as the slots it waits for; an idle server admits at once, and a server of few
        slots waits for no more than a quarter of them."""
        want = min(self.server_args.min_admission_batch, self.max_running_requests // 4)
        free = self.max_running_requests - running
        if want <= 1 or running == 0 or free >= want or len(self.waiting_queue) <= free:
            self.admission_deferred_steps = 0
            return False
        if self.admission_deferred_steps >= want:
            self.admission_deferred_steps = 0
            return False
        self.admission_deferred_steps += 1
        return True

    def _form_prefill(
        self, waiting: list[Req], chunked: Req | None
    ) -> tuple[PrefillAdder, ScheduleBatch | None]:
        """Admit from `waiting` (after `chunked`, the request prefilled chunk by chunk, if any)
        and build the pass inputs: the admitted requests' prefixes are locked, nothing is
        allocated and no queue changes (the caller commits). Whatever raises leaves no lock
        behind."""
        running = len(self.running_batch)
        adder = PrefillAdder(
            self.tree_cache,
            self.worker.allocator,
            self.running_batch.reqs,
            self.new_token_ratio,
            self.server_args.max_prefill_tokens,
            self.server_args.chunked_prefill_size,
        )
        try:
            if chunked is not None:
                adder.add_chunked_req(chunked)
            ordered, matched = self.policy.order(waiting)
            for req in ordered:
                if running + len(adder.can_run_list) >= self.max_running_requests:
                    break
                if (
                    req.lora_slot == NO_LORA_SLOT
                    and req.lora_name is not None
                    and not self._take_lora_slot(req)
                ):
                    continue  # its adapter is being read, or every slot is in use
                if not matched or adder.cache_changed:
                    req.init_next_round_input(self.tree_cache)
                if adder.add_one_req(req) != AddResult.CONTINUE:
                    break
            if not adder.can_run_list:
                return adder, None
            batch = self._new_batch(adder.can_run_list)
            batch.build_extend_inputs()
        except Exception:
            self._unlock_admitted(adder, chunked)
            raise
        return adder, batch

    def _end_failed_lora_waits(self) -> None:
        """End the waiting requests whose adapter could not be read (`_take_lora_slot`)."""
        failed = [r for r in self.waiting_queue if r.finished()]
        for req in failed:
            self.waiting_queue.remove(req)
            self._finish_waiting(req)

    def _take_lora_slot(self, req: Req) -> bool:
        """Give `req` its adapter's device slot (held until it ends); False while it waits."""
        assert self.lora is not None and req.lora_name is not None
        try:
            slot = self.lora.acquire(req.lora_name)
        except LoRALoadError as exc:
            # its first read (--lora-load lazy), or a read again after the host dropped it,
            # failed: the request ends at its next admission check, a 400 naming the adapter
            # (its source is at fault, not the server)
            req.finished_reason = {
                "type": "error",
                "message": f"the LoRA adapter {req.lora_name!r} cannot be loaded: {exc}",
                "param": "model",
                "code": "lora_load_failed",
            }
            return False
        if slot is None:
            return False
        req.lora_slot = slot
        return True

    def _unlock_admitted(self, adder: PrefillAdder, chunked: Req | None) -> None:
        """Undo the prefix locks admission took (the chunked request's is its own)."""
        for req in adder.can_run_list:
            if req is not chunked and req.last_node is not None:
                self.tree_cache.dec_lock_ref(req.last_node)

    def _end_requests_that_fail_alone(self) -> bool:
        """After forming a prefill batch raised: form one of each candidate alone (matched,
        admitted, its inputs built, nothing allocated; then unlocked again) and end every
        request whose own batch raises with an internal error, freeing what it holds as an
        abort does. Only on this failure path. False when no request fails alone."""
        chunked = self.chunked_req
        failing: list[tuple[Req, Exception]] = []
        for req in ([chunked] if chunked is not None else []) + list(self.waiting_queue):
            alone = req if req is chunked else None
            try:
                adder, _ = self._form_prefill([] if alone else [req], alone)
            except Exception as exc:
                failing.append((req, exc))
            else:
                self._unlock_admitted(adder, alone)
        for req, exc in failing:
            self._end_with_internal_error(req, exc)
            if req is chunked:
                # mid-prompt: its computed chunks go to the cache, its row and lock are freed
                self.chunked_req = None
                self._release_finished(req)
            else:
                self.waiting_queue.remove(req)
                self._finish_waiting(req)
        return bool(failing)

    def _end_with_internal_error(self, req: Req, exc: Exception) -> None:
        """Finish `req` with an internal error (a 500 at the front end) after code working for
        it alone raised; the caller frees what it holds. Its last output carries nothing but
        the error, so the code that raised is not run for it again."""
        logger.error("request %s failed in the scheduler; ending it alone", req.rid, exc_info=exc)
        req.finished_reason = internal_error(exc)
        req.sent_len = len(req.output_ids)
        req.pending_logprobs = []
        req.return_logprob = False

    def update_running_batch(self) -> ScheduleBatch | None:
        batch = self.running_batch
        if batch.decode_slots_short() > 0:
            retracted = batch.retract_decode()
            if retracted:
                self.counters.count_retractions(len(retracted))
                self.new_token_ratio = min(1.0, self.new_token_ratio + RETRACT_RATIO_STEP)
                logger.info("KV cache full: retracted %d requests", len(retracted))
                self.waiting_queue = retracted + self.waiting_queue
            if batch.decode_slots_short() > 0:
                # a single request that alone outgrows the KV cache cannot continue
                for req in batch.reqs:
                    req.finished_reason = {"type": "length"}
                self._drop_finished_running()
                return None
        else:
            self.new_token_ratio = max(
                self.server_args.new_token_ratio, self.new_token_ratio - RATIO_DECAY_PER_STEP
            )
        drafts = None
        if self.speculator is not None:
            # the verify step takes a KV slot and a decode row per token (rows: at most what
            # the decode graphs and the future-token ring are sized for)
            free = self.worker.allocator.available_size() + self.tree_cache.evictable_size()
            spare = min(free, self.max_running_requests) - len(batch)
            drafts = self.speculator.plan(batch.reqs, spare)
        if drafts is not None:
            batch.prepare_for_verify(drafts)
        else:
            batch.prepare_for_decode()
        return batch

    # -- results -----------------------------------------------------------------------------
    @staticmethod
    def _takes_token(launched: LaunchedBatch, req: Req, result: GenerationBatchResult) -> bool:
        """Whether `req`'s row of this result is a token for it (not a pooled row, and not the
        prefill of a request that asks for no tokens)."""
        if req.pooling is not None and result.pooled is not None:
            return False
        return launched.mode.is_decode() or req.sampling_params.max_new_tokens > 0

    def _accept_grammar_tokens(
        self, launched: LaunchedBatch, result: GenerationBatchResult, taking: list[tuple[int, Req]]
    ) -> dict[int, bool] | None:
        """The constrained rows' grammars accept this result's tokens, all in one call to their
        backend (xgrammar's batch API): {row: accepted}. None where each row accepts its own as
        it is appended: a verify step's tokens (walked one by one between stop checks), or a
        batch call that raised (each row then fails or not alone)."""
        if result.verified is not None:
            return None
        rows = [
            (i, req)
            for i, req in taking
            if req.grammar is not None and self._takes_token(launched, req, result)
        ]
        if not rows:
            return {}
        grammars = [req.grammar for _, req in rows]
        tokens = [result.next_token_ids[i] for i, _ in rows]
        try:
            accepted = grammars[0].backend.accept_tokens(grammars, tokens)
        except Exception:
            logger.exception("the batched grammar accepts failed; accepting row by row")
            return None
        return {i: ok for (i, _), ok in zip(rows, accepted, strict=True)}

    def _append_token(
        self, req: Req, result: GenerationBatchResult, i: int, verdicts: dict[int, bool] | None
    ) -> None:
        """Append row i's token(s); `verdicts`: the grammar's verdict on it, if already given."""
        if result.verified is not None:
            self._append_verified(req, result, i)
            return
        top = result.top_logprobs[i] if result.top_logprobs else []
        logprob = result.logprobs[i] if result.logprobs is not None else None
        accepted = verdicts.get(i) if verdicts is not None else None
        self._take_token(req, result.next_token_ids[i], logprob, top, accepted)

    def _append_verified(self, req: Req, result: GenerationBatchResult, i: int) -> None:
        """A verify step's tokens for row i, each with its stop checks: a request that stops
        midway takes no more of them. The KV slots past what the request keeps (rejected
        proposals, and those after a stop) go back to the allocator."""
        tokens = result.verified[i]
        logprobs = result.verified_logprobs[i] if result.verified_logprobs else None
        tops = result.verified_top_logprobs[i] if result.verified_top_logprobs else None
        emitted = 0
        for j, token in enumerate(tokens):
            logprob = logprobs[j] if logprobs is not None else None
            self._take_token(req, token, logprob, tops[j] if tops else [])
            emitted += 1
            req.check_finished(self.context_len, self.model.tokenizer)
            if req.finished():
                break
        kept = self.speculator.settle(req, emitted, len(tokens) - 1)
        if kept < req.kv_len:
            row = self.worker.req_to_token_pool.read(req.req_pool_idx, req.kv_len)
            self.worker.allocator.free(row[kept:])
            req.kv_len = kept

    def _take_token(
        self,
        req: Req,
        token: int,
        logprob: float | None,
        top: list[tuple[int, float]],
        accepted: bool | None = None,
    ) -> None:
        """Append one sampled token: its grammar accepts it (unless `accepted` is its verdict,
        already given), its logprobs are queued."""
        req.output_ids.append(token)
        if accepted is None and req.grammar is not None:
            accepted = req.grammar.accept_token(token)
        if req.grammar is not None and not accepted:
            # the mask allowed only what the grammar accepts: this is an engine bug
            logger.error("request %s: its grammar rejected sampled token %d", req.rid, token)
            req.finished_reason = {"type": "error", "message": "the grammar rejected a token"}
        if req.return_logprob and logprob is not None:
            req.pending_logprobs.append(TokenLogprob(token, logprob, list(top or [])))

    def _add_pooled(self, req: Req, row: torch.Tensor) -> None:
        """A pass's pooled row for a pooling request: the sum so far under mean pooling (a
        prompt prefilled in chunks gives one row per chunk), else the row itself."""
        if self.model.task.pooling == "mean" and req.pooled is not None:
            req.pooled = req.pooled + row
        else:
            req.pooled = row.clone()

    def _finish_pooling(self, req: Req, row: torch.Tensor) -> None:
        """End a pooling request with its embedding (mean, Matryoshka cut, normalisation) or
        its score."""
        self._add_pooled(req, row)
        task = self.model.task
        if task.task == "embed":
            dims = req.pooling.dimensions if req.pooling is not None else None
            req.pooled = finish_embedding(req.pooled, task, len(req.origin_input_ids), dims)
        req.finished_reason = {"type": "stop"}

    def _release_finished(self, req: Req) -> None:
        """Cache a finished request's KV in the tree (or free it) and send its last output."""
        if req.kv_len > req.seqlen:
            # an overlap step past the end took a slot for a token that was then dropped
            # (e.g. max_new_tokens=0): it holds nothing worth caching
            row = self.worker.req_to_token_pool.read(req.req_pool_idx, req.kv_len)
            self.worker.allocator.free(row[req.seqlen :])
            req.kv_len = req.seqlen
        self.tree_cache.cache_finished_req(req)
        req.req_pool_idx = None
        self.reqs_by_rid.pop(req.rid, None)
        self._emit(req)

    def _emit(self, req: Req) -> None:
        if req.lora_slot != NO_LORA_SLOT and req.finished():
            assert self.lora is not None
            self.lora.release(req.lora_slot)
            req.lora_slot = NO_LORA_SLOT
        if not req.stream and not req.finished():
            return
        new = req.output_ids[req.sent_len :]
        queue_time = None
        if not req.queue_time_sent and req.first_scheduled_time is not None:
            queue_time = max(0.0, req.first_scheduled_time - req.arrival_time)
            req.queue_time_sent = True
        if not new and not req.finished() and queue_time is None:
            return
        self.outputs.append(
            ReqOutput(
                rid=req.rid,
                new_token_ids=new,
                finished_reason=req.finished_reason,
                prompt_tokens=len(req.origin_input_ids),
                completion_tokens=len(req.output_ids),
                cached_tokens=req.cached_tokens,
                logprobs=req.pending_logprobs if req.return_logprob else None,
                queue_time=queue_time,
                pooled=(
                    req.pooled.numpy().astype("<f4").tobytes()
                    if req.pooled is not None and req.finished()
                    else None
                ),
            )
        )
        if req.lora_name is not None and self.lora is not None:
            self.lora.count_tokens(req.lora_name, len(new))
        req.sent_len = len(req.output_ids)
        req.pending_logprobs = []

    def pop_outputs(self) -> list[ReqOutput]:
        outputs, self.outputs = self.outputs, []
        return outputs

    def pop_stats(self) -> SchedulerStats:
        if self.speculator is not None:
            self.counters.count_speculation(self.speculator.counters.pop())
        stats = self.counters.pop(
            running=len(self.running_batch) + (1 if self.chunked_req else 0),
            queued=len(self.waiting_queue) + len(self.grammar_queue),
            kv_usage=self.kv_usage(),
            kv_evictable=self.kv_evictable(),
            max_total_tokens=self.max_total_tokens,
        )
        if self.kv_events is not None:
            stats.kv_events_published, stats.kv_events_dropped = self.kv_events.pop_counts()
        stats.kv_tiers = self.tree_cache.tier_report()
        if self.lora is not None:
            # running: the adapters requests hold slots of; waiting: those still without one
            stats.lora = self.lora.report(
                _adapters_of([r for r in self.waiting_queue if r.lora_slot == NO_LORA_SLOT])
            )
        return stats

    def _new_batch(self, reqs: list[Req]) -> ScheduleBatch:
        return ScheduleBatch(
            reqs,
            self.worker.req_to_token_pool,
            self.worker.allocator,
            self.tree_cache,
            self.model.vocab_size,
            self.worker.device,
            set(self.eos_token_ids),
        )

    # -- messages ----------------------------------------------------------------------------
    def dispatch(self, msg: Any) -> Any:
        """Apply one message from the front end; returns a reply to send, if any."""
        if isinstance(msg, TokenizedGenerateReqInput):
            try:
                self.handle_generate_request(msg)
            except Exception as exc:  # this request alone: refuse it, keep serving
                self._refuse_request(msg, exc)
        elif isinstance(msg, AbortReq):
            self.abort_request(msg.rid)
        elif isinstance(msg, GrammarsReadyReq):
            self.admit_grammars(msg.rids, msg.failed)
        elif isinstance(msg, FlushCacheReq):
            ok = self.flush_cache()
            return FlushCacheReqOutput(ok, "" if ok else "requests are running; not flushed")
        elif isinstance(msg, GetServerInfoReq):
            return GetServerInfoReqOutput(self.get_server_info())
        elif isinstance(msg, LoRAAdapterReq):
            # under tensor parallelism every rank serves the adapter from this same message on
            return self.change_lora_adapters(msg, wait=self.lora is not None and self.lora.lockstep)
        else:
            logger.warning("ignoring unknown message %r", type(msg).__name__)
        return None


def _adapters_of(reqs: list[Req]) -> list[str]:
    """The distinct LoRA adapters of `reqs`, in first-seen order."""
    return list(dict.fromkeys(r.lora_name for r in reqs if r.lora_name is not None))
