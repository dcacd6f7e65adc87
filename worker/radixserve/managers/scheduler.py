"""The scheduler: continuous batching over a radix prefix cache, in its own process.

Each step it (1) takes new requests and aborts off the socket, (2) admits waiting requests into a
prefill batch (policy order, PrefillAdder budgets, chunked prefill) or, when none can start,
advances the running batch by one decode step (retracting requests if KV runs out), (3) runs the
batch on the model worker and (4) appends sampled tokens, checks stops, caches finished requests'
KV in the radix tree and emits output deltas. The same object runs in-process for tests: `step()`
is one iteration of the loop without the sockets.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.process
import os
import signal
import socket
import tempfile
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from radixserve.distributed.parallel_state import destroy_tensor_parallel, init_tensor_parallel
from radixserve.logging_config import configure_logging
from radixserve.managers.io_struct import (
    AbortReq,
    BatchReqOutput,
    FlushCacheReq,
    FlushCacheReqOutput,
    GetServerInfoReq,
    GetServerInfoReqOutput,
    ReqOutput,
    SchedulerStats,
    StopRanksReq,
    TokenizedGenerateReqInput,
    TokenLogprob,
)
from radixserve.managers.schedule_batch import Req, ScheduleBatch
from radixserve.managers.schedule_policy import AddResult, PrefillAdder, SchedulePolicy
from radixserve.managers.tp_worker import GenerationBatchResult, ModelWorker, PendingBatchResult
from radixserve.mem_cache.chunk_cache import ChunkCache
from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.model_executor.forward_batch_info import ForwardMode
from radixserve.model_loader.loader import ModelSource, load_model_source_for
from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)

# new_token_ratio: raised after a retraction (admit less optimistically), then decays back.
RETRACT_RATIO_STEP = 0.15
RATIO_DECAY_PER_STEP = 0.002
# prefix cache hit rate gauge: over the prompts of the last this many admitted requests
HIT_RATE_WINDOW = 256


@dataclass
class LaunchedBatch:
    """What resolving a launched batch needs, frozen at launch (the ScheduleBatch moves on)."""

    reqs: list[Req]
    mode: ForwardMode
    chunked_req: Req | None
    num_tokens: int
    pending: PendingBatchResult
    start: float


@dataclass
class PortArgs:
    scheduler_input_ipc_name: str  # front end PUSH (connect) -> scheduler PULL (bind)
    tokenizer_ipc_name: str  # scheduler PUSH (connect) -> front end PULL (bind)

    @staticmethod
    def new() -> PortArgs:
        base = os.path.join(tempfile.gettempdir(), f"radixserve-{uuid.uuid4().hex[:12]}")
        return PortArgs(f"ipc://{base}-scheduler", f"ipc://{base}-tokenizer")

    def rank_ipc_name(self, rank: int) -> str:
        """Rank 0 PUSH (bind) -> rank `rank` PULL (connect): what rank 0 received, each step."""
        return f"{self.scheduler_input_ipc_name}-rank{rank}"


class Scheduler:
    def __init__(self, server_args: ServerArgs, source: ModelSource | None = None) -> None:
        self.server_args = server_args
        if source is None:
            source = load_model_source_for(server_args)
        self.source_description = source.description
        self.model_config = source.config
        self.tokenizer = source.tokenizer
        self.eos_token_ids = frozenset(source.config.eos_token_ids)
        self.worker = ModelWorker(server_args, source)
        runner = self.worker.model_runner
        self.runner = runner
        self.max_total_tokens = runner.max_total_tokens
        self.max_running_requests = runner.max_running_requests
        self.context_len = self.model_config.context_len
        cache_cls = ChunkCache if server_args.disable_radix_cache else RadixCache
        self.tree_cache = cache_cls(runner.req_to_token_pool, runner.allocator)
        self.policy = SchedulePolicy(server_args.schedule_policy, self.tree_cache)

        self.waiting_queue: list[Req] = []
        self.running_batch = self._new_batch([])
        self.chunked_req: Req | None = None
        self.last_batch: ScheduleBatch | None = None  # the batch launched last
        self.in_flight: LaunchedBatch | None = None  # launched, not yet resolved (overlap)
        self.overlap = not server_args.disable_overlap and self.runner.device.type == "cuda"
        self.reqs_by_rid: dict[str, Req] = {}
        self.outputs: list[ReqOutput] = []
        self.new_token_ratio = server_args.new_token_ratio

        # counters (monotonic) and metrics since the last stats report
        self.num_retractions = 0
        self.prefix_cache_query_tokens = 0
        self.prefix_cache_hit_tokens = 0
        self.computed_prefill_tokens = 0
        self.forward_steps_by_mode: dict[str, int] = {"prefill": 0, "decode": 0, "mixed": 0}
        self.hit_window: deque[tuple[int, int]] = deque(maxlen=HIT_RATE_WINDOW)
        self._stats_steps: list[tuple[str, int, int, float]] = []
        self._stats_deltas = [0, 0, 0]  # queries, hits, retractions

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
        )
        error = self._validate(req)
        if error is not None:
            req.finished_reason = {"type": "error", "message": error}
            self._emit(req)
            return
        self.reqs_by_rid[req.rid] = req
        self.waiting_queue.append(req)

    def _validate(self, req: Req) -> str | None:
        n = len(req.origin_input_ids)
        if n == 0:
            return "the prompt is empty"
        if n >= self.context_len:
            return f"the prompt has {n} tokens; the model's context length is {self.context_len}"
        if n + 1 > self.max_total_tokens:
            return f"the prompt has {n} tokens; the KV cache holds {self.max_total_tokens}"
        if any(t < 0 or t >= self.model_config.vocab_size for t in req.origin_input_ids):
            return f"input ids must be in [0, {self.model_config.vocab_size})"
        return None

    def abort_request(self, rid: str) -> None:
        req = self.reqs_by_rid.get(rid)
        if req is None or req.finished():
            return
        if req in self.waiting_queue:
            self.waiting_queue.remove(req)
            req.finished_reason = {"type": "abort"}
            self._finish_waiting(req)
        else:
            # running or mid-chunk: freed at the next step boundary
            req.finished_reason = {"type": "abort"}

    def _finish_waiting(self, req: Req) -> None:
        self.reqs_by_rid.pop(req.rid, None)
        self._emit(req)

    def flush_cache(self) -> bool:
        if self.in_flight is None:
            # the last batch may still await absorption although every request has finished
            self._absorb_last_batch()
            self._drop_finished_running()
        if self.has_work():
            return False
        self.tree_cache.reset()
        self.runner.allocator.clear()
        self.runner.req_to_token_pool.clear()
        return True

    def get_server_info(self) -> dict[str, Any]:
        return {
            "model": self.server_args.model,
            "model_description": self.source_description,
            "device": self.runner.device.type,
            "dtype": str(self.runner.dtype).removeprefix("torch."),
            "attention_backend": self.runner.attention_backend_name,
            "max_total_tokens": self.max_total_tokens,
            "max_running_requests": self.max_running_requests,
            "context_len": self.context_len,
            "vocab_size": self.model_config.vocab_size,
            "chunked_prefill_size": self.server_args.chunked_prefill_size,
            "schedule_policy": self.server_args.schedule_policy,
            "radix_cache": not self.server_args.disable_radix_cache,
            "num_running_requests": len(self.running_batch),
            "num_queued_requests": len(self.waiting_queue),
            "num_retractions": self.num_retractions,
            "prefix_cache_query_tokens": self.prefix_cache_query_tokens,
            "prefix_cache_hit_tokens": self.prefix_cache_hit_tokens,
            "computed_prefill_tokens": self.computed_prefill_tokens,
            "forward_steps_by_mode": dict(self.forward_steps_by_mode),
            "kv_cache_usage_ratio": self.kv_usage(),
            "free_slots": self.runner.allocator.available_size(),
            "evictable_size": self.tree_cache.evictable_size(),
            "protected_size": self.tree_cache.protected_size(),
            "new_token_ratio": self.new_token_ratio,
            "overlap": self.overlap,
            "gpu_busy_ms": self.worker.timeline.busy_ms,
            "gpu_gap_ms": self.worker.timeline.gap_ms,
            "gpu_decode_busy_ms": self.worker.timeline.decode_busy_ms,
            "gpu_decode_gap_ms": self.worker.timeline.decode_gap_ms,
            "matmul_parameters": self.model_config.matmul_parameters,
        }

    def kv_usage(self) -> float:
        return 1.0 - self.runner.allocator.available_size() / self.max_total_tokens

    def has_work(self) -> bool:
        return bool(
            self.waiting_queue
            or self.running_batch.reqs
            or self.chunked_req
            or self.in_flight
            or self.last_batch
        )

    # -- one iteration -----------------------------------------------------------------------
    def step(self) -> bool:
        """One iteration: form the next batch and launch it, then resolve the batch before it.

        With overlap the device runs batch N+1 while the host resolves batch N (and forms N+2);
        without it (or on the CPU, where nothing runs asynchronously) a batch is resolved right
        after its launch. False when nothing was launched or resolved.
        """
        batch = self.get_next_batch_to_run()
        launched = None
        if batch is not None:
            launched = self._launch(batch)
            if not self.overlap:
                self._resolve(launched)
                launched = None
        previous, self.in_flight = self.in_flight, launched
        if previous is not None:
            self._resolve(previous)
        if batch is None:
            self.worker.timeline.mark_idle()
        return batch is not None or previous is not None

    def _launch(self, batch: ScheduleBatch) -> LaunchedBatch:
        start = time.perf_counter()
        pending = self.worker.launch(batch.get_model_worker_batch())
        for i, req in enumerate(batch.reqs):
            if batch.forward_mode.is_decode() or req is not self.chunked_req:
                req.future_slot = pending.future_slot_start + i
        self.last_batch = batch
        return LaunchedBatch(
            reqs=list(batch.reqs),
            mode=batch.forward_mode,
            chunked_req=self.chunked_req if batch.forward_mode.is_extend() else None,
            num_tokens=int(batch.input_ids.numel()),
            pending=pending,
            start=start,
        )

    def _resolve(self, launched: LaunchedBatch) -> None:
        result = launched.pending.resolve()
        self.worker.timeline.add(launched.pending, launched.mode.is_decode())
        mode = launched.mode.metric_label
        self.forward_steps_by_mode[mode] += 1
        elapsed = time.perf_counter() - launched.start
        self._stats_steps.append((mode, len(launched.reqs), launched.num_tokens, elapsed))
        for i, req in enumerate(launched.reqs):
            if req is launched.chunked_req:
                continue  # an intermediate chunk samples nothing
            if req.future_slot == launched.pending.future_slot_start + i:
                req.future_slot = None
            if req.finished():
                # finished earlier (an overlap step past the end) or aborted meanwhile
                if req.req_pool_idx is not None:
                    self._release_finished(req)
                continue
            if launched.mode.is_decode() or req.sampling_params.max_new_tokens > 0:
                self._append_token(req, result, i)
            req.check_finished(self.context_len, self.tokenizer)
            if not req.finished():
                self._emit(req)
            elif req.req_pool_idx is not None:
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
        last.filter_batch([i for i, r in enumerate(last.reqs) if r is not chunked])
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
        if not self.waiting_queue and self.chunked_req is None:
            return None
        running = len(self.running_batch)
        if running >= self.max_running_requests and self.chunked_req is None:
            return None
        adder = PrefillAdder(
            self.tree_cache,
            self.runner.allocator,
            self.running_batch.reqs,
            self.new_token_ratio,
            self.server_args.max_prefill_tokens,
            self.server_args.chunked_prefill_size,
        )
        if self.chunked_req is not None:
            adder.add_chunked_req(self.chunked_req)
        ordered, matched = self.policy.order(self.waiting_queue)
        for req in ordered:
            if running + len(adder.can_run_list) >= self.max_running_requests:
                break
            if not matched:
                req.init_next_round_input(self.tree_cache)
            if adder.add_one_req(req) != AddResult.CONTINUE:
                break
        if not adder.can_run_list:
            return None
        admitted = {id(r) for r in adder.can_run_list}
        self.waiting_queue = [r for r in self.waiting_queue if id(r) not in admitted]
        for req in adder.can_run_list:
            if (
                req is not self.chunked_req
                and req.num_retractions == 0
                and req.first_scheduled_time is None
            ):
                self._count_prefix_hit(req)
        self.chunked_req = adder.new_chunked_req
        batch = self._new_batch(adder.can_run_list)
        batch.prepare_for_extend()
        self.computed_prefill_tokens += sum(batch.extend_lens)
        return batch

    def _count_prefix_hit(self, req: Req) -> None:
        query, hit = len(req.origin_input_ids), len(req.prefix_indices)
        req.cached_tokens = hit
        self.prefix_cache_query_tokens += query
        self.prefix_cache_hit_tokens += hit
        self._stats_deltas[0] += query
        self._stats_deltas[1] += hit
        self.hit_window.append((query, hit))

    def update_running_batch(self) -> ScheduleBatch | None:
        batch = self.running_batch
        if batch.decode_slots_short() > 0:
            retracted = batch.retract_decode()
            if retracted:
                self.num_retractions += len(retracted)
                self._stats_deltas[2] += len(retracted)
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
        batch.prepare_for_decode()
        return batch

    # -- results -----------------------------------------------------------------------------
    def _append_token(self, req: Req, result: GenerationBatchResult, i: int) -> None:
        token = result.next_token_ids[i]
        req.output_ids.append(token)
        if req.return_logprob and result.logprobs is not None:
            top = result.top_logprobs[i] if result.top_logprobs else []
            req.pending_logprobs.append(TokenLogprob(token, result.logprobs[i], list(top or [])))

    def _release_finished(self, req: Req) -> None:
        """Cache a finished request's KV in the tree (or free it) and send its last output."""
        if req.kv_len > req.seqlen:
            # an overlap step past the end took a slot for a token that was then dropped
            # (e.g. max_new_tokens=0): it holds nothing worth caching
            row = self.runner.req_to_token_pool.read(req.req_pool_idx, req.kv_len)
            self.runner.allocator.free(row[req.seqlen :])
            req.kv_len = req.seqlen
        self.tree_cache.cache_finished_req(req)
        req.req_pool_idx = None
        self.reqs_by_rid.pop(req.rid, None)
        self._emit(req)

    def _emit(self, req: Req) -> None:
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
            )
        )
        req.sent_len = len(req.output_ids)
        req.pending_logprobs = []

    def pop_outputs(self) -> list[ReqOutput]:
        outputs, self.outputs = self.outputs, []
        return outputs

    def pop_stats(self) -> SchedulerStats:
        queries = sum(q for q, _ in self.hit_window)
        hits = sum(h for _, h in self.hit_window)
        stats = SchedulerStats(
            num_running_requests=len(self.running_batch) + (1 if self.chunked_req else 0),
            num_queued_requests=len(self.waiting_queue),
            kv_cache_usage_ratio=self.kv_usage(),
            prefix_cache_hit_rate=hits / queries if queries else 0.0,
            max_total_tokens=self.max_total_tokens,
            prefix_cache_queries_tokens=self._stats_deltas[0],
            prefix_cache_hits_tokens=self._stats_deltas[1],
            retractions=self._stats_deltas[2],
            steps=self._stats_steps,
        )
        self._stats_steps = []
        self._stats_deltas = [0, 0, 0]
        return stats

    def _new_batch(self, reqs: list[Req]) -> ScheduleBatch:
        runner = self.worker.model_runner
        return ScheduleBatch(
            reqs,
            runner.req_to_token_pool,
            runner.allocator,
            self.tree_cache,
            self.model_config.vocab_size,
            runner.device,
            set(self.eos_token_ids),
        )

    # -- the process -------------------------------------------------------------------------
    def dispatch(self, msg: Any) -> Any:
        """Apply one message from the front end; returns a reply to send, if any."""
        if isinstance(msg, TokenizedGenerateReqInput):
            self.handle_generate_request(msg)
        elif isinstance(msg, AbortReq):
            self.abort_request(msg.rid)
        elif isinstance(msg, FlushCacheReq):
            ok = self.flush_cache()
            return FlushCacheReqOutput(ok, "" if ok else "requests are running; not flushed")
        elif isinstance(msg, GetServerInfoReq):
            return GetServerInfoReqOutput(self.get_server_info())
        else:
            logger.warning("ignoring unknown message %r", type(msg).__name__)
        return None


def run_scheduler_process(
    server_args: ServerArgs,
    port_args: PortArgs,
    ready_conn: Any,
    tp_rank: int = 0,
    dist_init_method: str | None = None,
) -> None:
    """Entry point of a scheduler process (multiprocessing 'spawn' target).

    With `--tp-size N`, the process the front end starts is rank 0: it starts ranks 1..N-1 as
    its own children, talks to the front end, and passes on what it receives each step, so that
    every rank makes the same scheduling decisions and runs its shard of every batch.
    """
    import zmq

    configure_logging(server_args.log_level, server_args.log_format, f"scheduler{tp_rank or ''}")
    parent = os.getppid()
    peers: list[multiprocessing.process.BaseProcess] = []
    try:
        if server_args.tp_size > 1:
            if tp_rank == 0:
                dist_init_method = f"tcp://127.0.0.1:{_free_port()}"
                peers = _start_peer_ranks(server_args, port_args, dist_init_method)
            device = server_args.resolved_device()
            init_tensor_parallel(
                tp_rank,
                server_args.tp_size,
                dist_init_method,
                torch.device(f"cuda:{tp_rank}") if device == "cuda" else torch.device("cpu"),
            )
        scheduler = Scheduler(server_args)
        logger.info("model loaded; KV capacity %d tokens", scheduler.max_total_tokens)
    except Exception as exc:  # report any load failure to the parent, then exit
        logger.exception("scheduler failed to start")
        if ready_conn is not None:
            ready_conn.send({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
        for peer in peers:
            peer.terminate()
        return
    ctx = zmq.Context(1)
    if tp_rank != 0:
        from_first = ctx.socket(zmq.PULL)
        from_first.connect(port_args.rank_ipc_name(tp_rank))
        _follow_first_rank(scheduler, from_first, parent)
        from_first.close(linger=0)
        ctx.term()
        return
    recv_sock = ctx.socket(zmq.PULL)
    recv_sock.bind(port_args.scheduler_input_ipc_name)
    send_sock = ctx.socket(zmq.PUSH)
    send_sock.connect(port_args.tokenizer_ipc_name)
    to_ranks = []
    for rank in range(1, server_args.tp_size):
        to_ranks.append(ctx.socket(zmq.PUSH))
        to_ranks[-1].bind(port_args.rank_ipc_name(rank))
    ready_conn.send(
        {
            "status": "ready",
            "max_total_tokens": scheduler.max_total_tokens,
            "max_running_requests": scheduler.max_running_requests,
            "context_len": scheduler.context_len,
            "vocab_size": scheduler.model_config.vocab_size,
            "model_description": scheduler.source_description,
            "device": scheduler.runner.device.type,
            "attention_backend": scheduler.runner.attention_backend_name,
        }
    )
    _serve(scheduler, recv_sock, send_sock, to_ranks, parent)
    if peers:
        _stop_peer_ranks(peers, to_ranks)
    # outputs for a front end that is gone must not hold the exit
    for sock in (recv_sock, send_sock, *to_ranks):
        sock.close(linger=0)
    ctx.term()
    destroy_tensor_parallel()


def _serve(
    scheduler: Scheduler,
    recv_sock: Any,
    send_sock: Any,
    to_ranks: list[Any],
    parent: int,
) -> None:
    """Rank 0's loop, until SIGTERM (the front end stopping it) or the front end's death.

    Each iteration's messages go to ranks 1..N-1 (`to_ranks`) before rank 0 applies them: a
    send, never a wait, so the host's critical path between two steps has no round trip
    between ranks (a gloo object broadcast took ~0.9 ms on a 2-core CPU); the devices stay in
    step through their own collectives.

    SIGTERM only sets a flag: the step in progress finishes, so that with --tp-size > 1 every
    rank is between collectives when the others are told to stop."""
    import zmq

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    idle_reported = True
    while not stopping.is_set():
        busy = scheduler.has_work()
        # block (bounded, to notice a dead parent) only when there is nothing to run
        if not busy and not recv_sock.poll(timeout=200) and os.getppid() != parent:
            logger.info("front end is gone; exiting")
            return
        messages = []
        while True:
            try:
                messages.append(recv_sock.recv_pyobj(zmq.NOBLOCK))
            except zmq.Again:
                break
        for sock in to_ranks:
            sock.send_pyobj(messages)
        for msg in messages:
            reply = scheduler.dispatch(msg)
            if reply is not None:
                send_sock.send_pyobj(reply)
        ran = scheduler.step()
        outputs = scheduler.pop_outputs()
        if ran or outputs or not idle_reported:
            send_sock.send_pyobj(BatchReqOutput(outputs, scheduler.pop_stats()))
            idle_reported = not ran and not scheduler.has_work()
        elif busy and os.getppid() != parent:
            return


def _follow_first_rank(scheduler: Scheduler, from_first: Any, parent: int) -> None:
    """Ranks 1..N-1: apply rank 0's messages and step in lockstep with it (one message list
    per rank-0 iteration, at least five a second); outputs are rank 0's job. Rank 0 ends this
    with a StopRanksReq; a rank 0 that died instead is noticed as a changed parent."""
    while True:
        if not from_first.poll(timeout=1000):
            if os.getppid() != parent:
                logger.info("rank 0 is gone; exiting")
                return
            continue
        messages = from_first.recv_pyobj()
        if any(isinstance(msg, StopRanksReq) for msg in messages):
            destroy_tensor_parallel()
            return
        for msg in messages:
            scheduler.dispatch(msg)
        scheduler.step()
        scheduler.pop_outputs()


def _stop_peer_ranks(peers: list[multiprocessing.process.BaseProcess], to_ranks: list[Any]) -> None:
    """Tell ranks 1..N-1 to stop and wait for them, so that they take their NCCL
    communicators down while rank 0's store still answers (otherwise each logs a stack of
    'TCPStore ... Connection was likely closed' warnings)."""
    for sock in to_ranks:
        sock.send_pyobj([StopRanksReq()])
    for peer in peers:
        peer.join(timeout=5)
        if peer.is_alive():
            peer.terminate()


def _start_peer_ranks(
    server_args: ServerArgs, port_args: PortArgs, dist_init_method: str
) -> list[multiprocessing.process.BaseProcess]:
    context = multiprocessing.get_context("spawn")
    peers = []
    for rank in range(1, server_args.tp_size):
        peer = context.Process(
            target=run_scheduler_process,
            args=(server_args, port_args, None, rank, dist_init_method),
            name=f"radixserve-scheduler-tp{rank}",
            daemon=True,  # ends with rank 0
        )
        peer.start()
        peers.append(peer)
    return peers


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
