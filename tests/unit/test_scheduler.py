"""The scheduling policy driven by a fake model worker (scheduler_harness.py): no model, no
kernels, seconds. A request's correct output is known whatever the batching, chunking,
retraction or overlap did to it; at the end of every run all KV is either free or evictable
prefix cache and every request row is free again.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_harness import (
    CONTEXT,
    VOCAB,
    Run,
    assert_memory_returned,
    collect,
    drain,
    expected_output,
    make_scheduler,
    prompt,
    submit,
)

from radixserve.boundary import AbortReq


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


def test_an_adapter_read_ending_while_its_replies_are_collected_is_answered():
    """pop_replies looks at each read once: a read that ends between two looks (done to the
    second, not to the first) was once dropped from both lists, and its admin call never got
    an answer."""
    from types import SimpleNamespace

    from radixserve.scheduler.scheduler import Scheduler

    class EndsWhileLookedAt:
        def __init__(self) -> None:
            self.looks = 0

        def done(self) -> bool:
            self.looks += 1
            return self.looks > 1

    finished: list[str] = []
    fake = SimpleNamespace(
        _lora_loads=[("load beta", EndsWhileLookedAt())],
        _finish_lora_load=lambda msg, future: finished.append(msg) or msg,
    )
    answered = Scheduler.pop_replies(fake)  # type: ignore[arg-type]
    answered += Scheduler.pop_replies(fake)  # type: ignore[arg-type]
    assert answered == ["load beta"] and finished == ["load beta"] and fake._lora_loads == []
