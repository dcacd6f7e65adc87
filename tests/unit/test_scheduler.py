"""The scheduling policy driven by a fake model worker: no model, no kernels, seconds.

The fake's next token is a fixed function of each request's last input token, so a request's
correct output is known whatever the batching, chunking, retraction or overlap did to it. At
every launch the fake also checks the memory the batch claims: its new KV slots are allocated
(not on the free list) and distinct, and every request row holds an allocated slot for each of
its tokens. At the end of every run all KV is either free or evictable prefix cache and every
request row is free again.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixserve.forward.worker_batch import ModelWorkerBatch
from radixserve.managers.io_struct import AbortReq, TokenizedGenerateReqInput
from radixserve.managers.scheduler import Scheduler, ServedModel
from radixserve.managers.tp_worker import GpuTimeline, PendingBatchResult
from radixserve.mem_cache.allocator import TokenSlotAllocator
from radixserve.mem_cache.memory_pool import ReqToTokenPool
from radixserve.model_executor.future_tokens import FutureTokens
from radixserve.sampling.sampling_params import SamplingParams
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

    def __init__(self, max_total_tokens: int, max_running_requests: int, asynchronous: bool):
        self.req_to_token_pool = ReqToTokenPool(max_running_requests + 2, CONTEXT + 8, "cpu")
        self.allocator = TokenSlotAllocator(max_total_tokens)
        self.max_total_tokens = max_total_tokens
        self.max_running_requests = max_running_requests
        self.device = torch.device("cpu")
        self.asynchronous = asynchronous
        self.timeline = GpuTimeline()
        self.future = FutureTokens(max_running_requests + 2, self.device)
        self.batches: list[ModelWorkerBatch] = []

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
        tokens = (last * 31 + 7) % VOCAB
        slots = self.future.reserve(len(batch.seq_lens))
        self.future.store(slots, tokens)
        return PendingBatchResult(tokens, None, None, slots)

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
    **server_args,
) -> Scheduler:
    worker = FakeWorker(max_total_tokens, max_running_requests, asynchronous)
    model = ServedModel(context_len=CONTEXT, vocab_size=VOCAB, eos_token_ids=frozenset())
    return Scheduler(ServerArgs(device="cpu", **server_args), worker, model)


def submit(scheduler: Scheduler, rid: str, prompt: list[int], max_new_tokens: int) -> None:
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
    scheduler.dispatch(TokenizedGenerateReqInput(rid, prompt, params, stream=True))


def drain(scheduler: Scheduler, run: Run | None = None, max_steps: int = 20_000) -> Run:
    run = run or Run(scheduler, scheduler.worker, {}, {}, {})
    for _ in range(max_steps):
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


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "overlap"])
def test_outputs_are_right_and_memory_comes_back(asynchronous):
    scheduler = make_scheduler(asynchronous=asynchronous)
    assert scheduler.overlap == asynchronous
    prompts = {f"r{i}": prompt(i, 5 + 7 * i) for i in range(6)}
    for rid, ids in prompts.items():
        submit(scheduler, rid, ids, 9)
    run = drain(scheduler)
    for rid, ids in prompts.items():
        assert run.outputs[rid] == expected_output(ids, 9)
        assert run.finish[rid]["type"] == "length"
    assert_memory_returned(scheduler)


def test_admission_respects_the_prefill_token_budget():
    scheduler = make_scheduler(max_prefill_tokens=64, chunked_prefill_size=64)
    prompts = {f"r{i}": prompt(i, 30) for i in range(5)}
    for rid, ids in prompts.items():
        submit(scheduler, rid, ids, 2)
    run = drain(scheduler)
    extends = [b for b in scheduler.worker.batches if b.forward_mode.is_extend()]
    assert all(sum(b.extend_seq_lens) <= 64 for b in extends)
    assert [len(b.extend_seq_lens) for b in extends[:2]] == [2, 2]  # 30 + 30 fit, a third not
    assert all(run.outputs[r] == expected_output(p, 2) for r, p in prompts.items())


def test_a_long_prompt_is_prefilled_in_chunks():
    scheduler = make_scheduler(chunked_prefill_size=32, max_prefill_tokens=32)
    long = prompt(1, 100)
    submit(scheduler, "long", long, 3)
    run = drain(scheduler)
    extends = [b for b in scheduler.worker.batches if b.forward_mode.is_extend()]
    assert [b.extend_seq_lens for b in extends] == [[32], [32], [32], [4]]
    assert [b.extend_prefix_lens for b in extends] == [[0], [32], [64], [96]]
    assert run.outputs["long"] == expected_output(long, 3)
    assert_memory_returned(scheduler)


@pytest.mark.parametrize("policy", ["lpm", "fcfs"])
def test_lpm_admits_the_longest_cached_prefix_first(policy):
    scheduler = make_scheduler(schedule_policy=policy, max_prefill_tokens=48)
    shared = prompt(7, 40)
    submit(scheduler, "warm", shared + [5], 1)
    drain(scheduler)
    submit(scheduler, "cold", prompt(8, 44), 1)  # arrives first, shares nothing
    submit(scheduler, "hot", shared + [9, 9, 9], 1)  # 40 of its tokens are cached
    run = drain(scheduler)
    order = list(run.outputs)  # first output order follows admission order (one per pass)
    assert order == (["hot", "cold"] if policy == "lpm" else ["cold", "hot"])
    assert run.cached["hot"] == 40 and run.cached["cold"] == 0


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "overlap"])
def test_retraction_when_slots_run_out_keeps_outputs_right(asynchronous):
    scheduler = make_scheduler(
        max_total_tokens=160, asynchronous=asynchronous, new_token_ratio=0.05
    )
    prompts = {f"r{i}": prompt(i, 20) for i in range(5)}
    for rid, ids in prompts.items():
        submit(scheduler, rid, ids, 25)
    run = drain(scheduler)
    assert scheduler.counters.num_retractions > 0
    for rid, ids in prompts.items():
        assert run.outputs[rid] == expected_output(ids, 25), rid
    assert_memory_returned(scheduler)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "overlap"])
def test_abort_of_queued_and_running_requests(asynchronous):
    scheduler = make_scheduler(max_running_requests=2, asynchronous=asynchronous)
    for i in range(4):
        submit(scheduler, f"r{i}", prompt(i, 10), 50)
    run = Run(scheduler, scheduler.worker, {}, {}, {})
    for _ in range(3):
        scheduler.step()
        collect(scheduler, run)
    assert {r.rid for r in scheduler.waiting_queue} == {"r2", "r3"}
    scheduler.dispatch(AbortReq("r3"))  # queued
    scheduler.dispatch(AbortReq("r0"))  # running
    drain(scheduler, run)
    assert run.finish["r3"] == {"type": "abort"} and not run.outputs.get("r3")
    assert run.finish["r0"] == {"type": "abort"} and len(run.outputs["r0"]) < 50
    assert run.outputs["r0"] == expected_output(prompt(0, 10), 50)[: len(run.outputs["r0"])]
    assert run.outputs["r1"] == expected_output(prompt(1, 10), 50)
    assert run.outputs["r2"] == expected_output(prompt(2, 10), 50)
    assert_memory_returned(scheduler)


def test_n_copies_share_one_prefill():
    """What the front end does for n > 1: prefill the prompt once (max_new_tokens=0), then
    run n copies that find it in the prefix cache."""
    scheduler = make_scheduler()
    ids = prompt(3, 60)
    submit(scheduler, "prefill", ids, 0)
    drain(scheduler)
    for i in range(4):
        submit(scheduler, f"copy{i}", ids, 5)
    run = drain(scheduler)
    assert all(run.outputs[f"copy{i}"] == expected_output(ids, 5) for i in range(4))
    assert all(run.cached[f"copy{i}"] == 59 for i in range(4))  # all but the last token
    assert scheduler.counters.computed_prefill_tokens == 60 + 4  # the prompt once, 1 token each
    assert_memory_returned(scheduler)


def test_invalid_prompts_end_with_an_error_and_are_never_scheduled():
    scheduler = make_scheduler(max_total_tokens=64)
    submit(scheduler, "empty", [], 4)
    submit(scheduler, "too-long", prompt(1, CONTEXT), 4)
    submit(scheduler, "bad-id", [1, VOCAB + 5], 4)
    submit(scheduler, "over-kv", prompt(2, 100), 4)
    run = drain(scheduler)
    assert {rid: f["type"] for rid, f in run.finish.items()} == dict.fromkeys(
        ["empty", "too-long", "bad-id", "over-kv"], "error"
    )
    assert scheduler.worker.batches == []


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 90), min_size=1, max_size=8),
    new_tokens=st.lists(st.integers(0, 30), min_size=8, max_size=8),
    shared_prefix=st.integers(0, 40),
    chunk=st.integers(8, 64),
    max_total_tokens=st.integers(200, 600),
    asynchronous=st.booleans(),
    radix=st.booleans(),
    mixed=st.booleans(),
    policy=st.sampled_from(["lpm", "fcfs"]),
)
def test_any_workload_gives_the_reference_outputs_and_returns_memory(
    lengths, new_tokens, shared_prefix, chunk, max_total_tokens, asynchronous, radix, mixed, policy
):
    scheduler = make_scheduler(
        max_total_tokens=max_total_tokens,
        max_running_requests=4,
        asynchronous=asynchronous,
        chunked_prefill_size=chunk,
        max_prefill_tokens=max(chunk, 64),
        disable_radix_cache=not radix,
        enable_mixed_chunk=mixed,
        schedule_policy=policy,
    )
    head = prompt(99, shared_prefix)
    prompts = {f"r{i}": prompt(i, n, head) for i, n in enumerate(lengths)}
    for (rid, ids), n in zip(prompts.items(), new_tokens, strict=False):
        submit(scheduler, rid, ids, n)
    run = drain(scheduler)
    for (rid, ids), n in zip(prompts.items(), new_tokens, strict=False):
        assert run.outputs.get(rid, []) == expected_output(ids, n), rid
        assert run.finish[rid]["type"] == "length"
    assert_memory_returned(scheduler)
