"""A fake model worker and helpers that drive the scheduling policy without a model.

The fake's next token is a fixed function of each request's last input token, so a request's
correct output is known whatever the batching, chunking, retraction or overlap did to it. At
every launch the fake also checks the memory the batch claims: its new KV slots are allocated
(not on the free list) and distinct, and every request row holds an allocated slot for each of
its tokens.

Given a `logits_table` instead, the fake's logits are that table's row of the last token and it
samples them with the real Sampler, as the model worker does: constrained batches launch their
forward and sample later (`sample_deferred`) with their grammar masks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.boundary import TokenizedGenerateReqInput
from radixserve.forward.worker_batch import ModelWorkerBatch
from radixserve.layers.sampler import Sampler
from radixserve.mem_cache.allocator import TokenSlotAllocator
from radixserve.mem_cache.memory_pool import ReqToTokenPool
from radixserve.model_executor.future_tokens import FutureTokens
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.scheduler.scheduler import Scheduler, ServedModel
from radixserve.scheduler.tp_worker import GpuTimeline, PendingBatchResult
from radixserve.server_args import ServerArgs

VOCAB = 1000
CONTEXT = 512


def next_token(last: int) -> int:
    return (last * 31 + 7) % VOCAB


def expected_output(prompt: list[int], max_new_tokens: int) -> list[int]:
    out, last = [], prompt[-1]
    for _ in range(max_new_tokens):
        last = next_token(last)
        out.append(last)
    return out


class FakeWorker:
    """The `BatchWorker` shape with CPU memory pools and no model."""

    def __init__(
        self,
        max_total_tokens: int,
        max_running_requests: int,
        asynchronous: bool,
        logits_table: torch.Tensor | None = None,
    ):
        self.logits_table = logits_table  # [vocab, vocab]: row t holds the logits after token t
        self.sampler = Sampler()
        self.req_to_token_pool = ReqToTokenPool(max_running_requests + 2, CONTEXT + 8, "cpu")
        self.allocator = TokenSlotAllocator(max_total_tokens)
        self.max_total_tokens = max_total_tokens
        self.max_running_requests = max_running_requests
        self.device = torch.device("cpu")
        self.asynchronous = asynchronous
        self.timeline = GpuTimeline()
        self.future = FutureTokens(max_running_requests + 2, self.device)
        self.batches: list[ModelWorkerBatch] = []
        self.masks_filled = 0
        # masks the scheduler had not started filling by the time the sampling needed them
        self.masks_filled_late = 0

    def describe(self) -> dict[str, str]:
        return {"device": "cpu", "dtype": "none", "attention_backend": "fake"}

    def launch(self, batch: ModelWorkerBatch) -> PendingBatchResult:
        self.batches.append(batch)
        self._check_memory(batch)
        ids = self.future.resolve(batch.input_ids)
        if batch.forward_mode.is_decode():
            last = ids
        else:
            ends = torch.cumsum(torch.tensor(batch.extend_seq_lens), 0) - 1
            last = ids[ends]
        pending = PendingBatchResult(self.future.reserve(len(batch.seq_lens)))
        if self.logits_table is None:
            self._set_tokens(pending, (last * 31 + 7) % VOCAB, batch)
        else:
            pending.deferred = (self.logits_table[last].clone(), batch)
            if not batch.sampling_info.has_grammars:
                self.sample_deferred(pending)
        return pending

    def sample_deferred(self, pending: PendingBatchResult) -> None:
        (logits, batch), pending.deferred = pending.deferred, None
        info = batch.sampling_info
        if info.has_grammars:
            started = info.pending_mask is not None
            info.update_grammar_mask()
            self.masks_filled += 1
            self.masks_filled_late += info.vocab_mask is not None and not started
        self._set_tokens(pending, self.sampler(logits, info).next_token_ids, batch)

    def _set_tokens(
        self, pending: PendingBatchResult, tokens: torch.Tensor, batch: ModelWorkerBatch
    ) -> None:
        self.future.store(pending.future, tokens)
        batch.sampling_info.update_with_new_tokens(tokens)
        pending.set_tokens(tokens, None, None)

    def _check_memory(self, batch: ModelWorkerBatch) -> None:
        free = set(self.allocator.free_slots().tolist())
        new = batch.out_cache_loc.tolist()
        assert len(set(new)) == len(new), "a slot handed to two tokens of one pass"
        assert not free & set(new), "a pass writes KV into free slots"
        table = self.req_to_token_pool.req_to_token
        for row, length in zip(
            batch.req_pool_indices.tolist(), batch.seq_lens.tolist(), strict=True
        ):
            cells = table[row, :length].tolist()
            assert all(c > 0 for c in cells), "a request reads an unwritten KV cell"
            assert not free & set(cells), "a request reads KV from a free slot"


@dataclass
class Run:
    scheduler: Scheduler
    worker: FakeWorker
    outputs: dict[str, list[int]]
    finish: dict[str, dict]
    cached: dict[str, int]


def make_scheduler(
    max_total_tokens: int = 4096,
    max_running_requests: int = 16,
    asynchronous: bool = False,
    model: ServedModel | None = None,
    logits_table: torch.Tensor | None = None,
    **server_args,
) -> Scheduler:
    worker = FakeWorker(max_total_tokens, max_running_requests, asynchronous, logits_table)
    model = model or ServedModel(context_len=CONTEXT, vocab_size=VOCAB, eos_token_ids=frozenset())
    return Scheduler(ServerArgs(device="cpu", **server_args), worker, model)


def submit(scheduler: Scheduler, rid: str, prompt: list[int], max_new_tokens: int) -> None:
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
    scheduler.dispatch(TokenizedGenerateReqInput(rid, prompt, params, stream=True))


def drain(scheduler: Scheduler, run: Run | None = None, max_steps: int = 20_000) -> Run:
    run = run or Run(scheduler, scheduler.worker, {}, {}, {})
    for _ in range(max_steps):
        if scheduler.waiting_only_in_background():
            scheduler.wait_in_background(timeout=60)
        scheduler.step()
        collect(scheduler, run)
        if not scheduler.has_work():
            return run
    raise AssertionError("the scheduler did not finish")


def collect(scheduler: Scheduler, run: Run) -> None:
    for out in scheduler.pop_outputs():
        run.outputs.setdefault(out.rid, []).extend(out.new_token_ids)
        run.cached[out.rid] = out.cached_tokens
        if out.finished_reason is not None:
            run.finish[out.rid] = out.finished_reason


def assert_memory_returned(scheduler: Scheduler) -> None:
    worker, cache = scheduler.worker, scheduler.tree_cache
    assert cache.protected_size() == 0
    assert worker.allocator.available_size() + cache.evictable_size() == worker.max_total_tokens
    worker.allocator.check_no_duplicates()
    assert worker.req_to_token_pool.available_size() == worker.req_to_token_pool.size


def prompt(seed: int, length: int, prefix: list[int] | None = None) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    body = torch.randint(1, VOCAB, (length,), generator=gen).tolist()
    return (prefix or []) + body
