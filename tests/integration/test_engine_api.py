"""The in-process Engine over a real scheduler subprocess (a tiny random Llama, token ids only)."""

from __future__ import annotations

import asyncio
import time

import pytest
from engine_harness import make_scheduler

from radixserve.frontend.engine import Engine
from radixserve.frontend.tokenizer_manager import PromptTooLongError
from radixserve.scheduler.scheduler_process import warm_up

pytestmark = pytest.mark.slow

GREEDY = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine():
    # A queue limit below the batch sizes used here: in-process batches are not refused.
    with Engine(model="random:tiny-llama", max_total_tokens=4096, max_queued_requests=2) as e:
        yield e


def wait_until(condition, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_one_prompt_gives_one_result(engine):
    result = engine.generate(input_ids=[1, 5, 9, 13], sampling_params=GREEDY)
    assert isinstance(result, dict)
    assert len(result["output_ids"]) == 6
    meta = result["meta_info"]
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (4, 6)
    assert meta["finish_reason"] == {"type": "length"}


def test_greedy_is_repeatable_and_the_repeat_hits_the_cache(engine):
    prompt = list(range(40, 80))
    first = engine.generate(input_ids=prompt, sampling_params=GREEDY)
    second = engine.generate(input_ids=prompt, sampling_params=GREEDY)
    assert second["output_ids"] == first["output_ids"]
    assert second["meta_info"]["cached_tokens"] >= len(prompt) - 1


def test_a_batch_with_n_samples_gives_prompts_times_n_results(engine):
    params = {"max_new_tokens": 3, "n": 2, "seed": 11, "ignore_eos": True}
    results = engine.generate(input_ids=[[1, 2, 3], [4, 5, 6, 7]], sampling_params=params)
    assert len(results) == 4
    assert [r["meta_info"]["prompt_tokens"] for r in results] == [3, 3, 4, 4]
    assert all(len(r["output_ids"]) == 3 for r in results)


def test_stream_yields_the_same_tokens_as_generate(engine):
    prompt = [7, 8, 9, 10, 11]
    whole = engine.generate(input_ids=prompt, sampling_params=GREEDY)
    items = list(engine.generate_stream(input_ids=prompt, sampling_params=GREEDY))
    assert [t for item in items for t in item["output_ids"]] == whole["output_ids"]
    assert items[-1]["meta_info"]["finish_reason"] == {"type": "length"}
    assert all(item["meta_info"]["finish_reason"] is None for item in items[:-1])


def test_closing_a_stream_early_aborts_the_request(engine):
    long = {"max_new_tokens": 1500, "ignore_eos": True}
    stream = engine.generate_stream(input_ids=[3, 1, 4, 1, 5], sampling_params=long)
    next(stream)
    stream.close()

    def scheduler_idle() -> bool:
        info = engine.get_server_info()
        return info["num_running_requests"] == 0 and info["num_queued_requests"] == 0

    assert wait_until(scheduler_idle)
    assert engine.tokenizer_manager.num_in_flight == 0


def test_logprobs(engine):
    result = engine.generate(
        input_ids=[2, 4, 6], sampling_params=GREEDY, return_logprob=True, top_logprobs_num=3
    )
    logprobs = result["meta_info"]["output_token_logprobs"]
    assert [entry[1] for entry in logprobs] == result["output_ids"]
    for logprob, _, top in logprobs:
        assert len(top) == 3
        assert logprob == pytest.approx(top[0][1], abs=1e-4)  # greedy picks the top token


def test_async_generate_from_another_event_loop(engine):
    async def two_at_once():
        return await asyncio.gather(
            engine.async_generate(input_ids=[1, 2], sampling_params=GREEDY),
            engine.async_generate(input_ids=[3, 4], sampling_params=GREEDY),
        )

    results = asyncio.run(two_at_once())
    assert [len(r["output_ids"]) for r in results] == [6, 6]


def test_async_stream_from_another_event_loop(engine):
    async def collect():
        return [
            item
            async for item in engine.async_generate_stream(input_ids=[9], sampling_params=GREEDY)
        ]

    items = asyncio.run(collect())
    assert sum(len(i["output_ids"]) for i in items) == 6


def test_bad_inputs_raise_value_errors(engine):
    with pytest.raises(ValueError, match="no tokenizer"):
        engine.generate(prompt="text needs a tokenizer")
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(input_ids=[1], sampling_params={"top_p": 0.0})
    with pytest.raises(ValueError, match="unknown sampling parameter"):
        engine.generate(input_ids=[1], sampling_params={"temprature": 0.0})
    with pytest.raises(PromptTooLongError):
        engine.generate(input_ids=[1] * 5000)


def test_server_info_has_scheduler_counters_and_flush_empties_the_cache(engine):
    engine.generate(input_ids=list(range(100, 130)), sampling_params=GREEDY)
    info = engine.get_server_info()
    for key in ("num_retractions", "prefix_cache_hit_tokens", "kv_cache_usage_ratio"):
        assert key in info
    assert info["evictable_size"] > 0
    # the scheduler process froze its start-up heap (torch, the model) out of the collector
    assert info["gc_frozen_objects"] > 50_000
    assert set(info["gc_collections"]) == {"0", "1", "2"}
    assert engine.flush_cache() is True
    assert engine.get_server_info()["evictable_size"] == 0


def test_warm_up_leaves_no_trace():
    """The start-up warm-up (run before a GPU worker reports ready) serves its requests and
    leaves an empty cache, zero counters and every KV slot free."""
    scheduler = make_scheduler("random:tiny-llama", max_total_tokens=2048)
    prompt_lengths = []
    handle = scheduler.handle_generate_request
    scheduler.handle_generate_request = lambda req: (
        prompt_lengths.append(len(req.input_ids)),
        handle(req),
    )
    warm_up(scheduler)
    # long prompts too (the GEMM shapes of a full chunk), as far as the KV pool allows
    assert max(prompt_lengths) == 2048 // 4
    info = scheduler.get_server_info()
    assert info["computed_prefill_tokens"] == 0 and info["forward_steps_by_mode"]["prefill"] == 0
    assert info["free_slots"] == scheduler.max_total_tokens
    assert info["evictable_size"] == info["protected_size"] == 0
    assert not scheduler.has_work() and scheduler.pop_outputs() == []
