"""Greedy output of the engine is token-identical to transformers `generate` on the same
weights, across the Llama family and across the scheduler's paths: concurrency, chunked prefill,
radix cache on/off, both policies, and retraction under KV pressure."""

from __future__ import annotations

import pytest
from engine_harness import (
    check_against_hf,
    hf_greedy,
    make_scheduler,
    random_prompts,
    run_to_completion,
)

from radixserve.model_loader.loader import build_hf_reference, load_model_source

TINY = ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3"]
NEW = 12


@pytest.fixture(scope="module", params=TINY)
def tiny(request):
    source = load_model_source(f"random:{request.param}", device="cpu")
    return request.param, source, build_hf_reference(source)


@pytest.fixture(scope="module")
def tiny_llama():
    source = load_model_source("random:tiny-llama", device="cpu")
    return source, build_hf_reference(source)


def test_single_requests_match_transformers(tiny, greedy):
    name, source, hf = tiny
    prompts = random_prompts(3, source.config.vocab_size, 1, 40, seed=1)
    for prompt in prompts:
        scheduler = make_scheduler(f"random:{name}", source)
        results = run_to_completion(scheduler, [prompt], greedy(NEW))
        assert results["r0"]["ids"] == hf_greedy(hf, prompt, NEW)
        assert results["r0"]["finish"] == {"type": "length"}


def test_concurrent_mixed_lengths_match_transformers(tiny, greedy):
    name, source, hf = tiny
    prompts = random_prompts(16, source.config.vocab_size, 2, 60, seed=2)
    scheduler = make_scheduler(f"random:{name}", source)
    results = run_to_completion(scheduler, prompts, greedy(NEW))
    check_against_hf(hf, prompts, results, NEW)


@pytest.mark.parametrize("radix", [True, False], ids=["radix", "no-radix"])
@pytest.mark.parametrize("policy", ["lpm", "fcfs"])
def test_chunked_prefill_shared_prefixes(tiny_llama, greedy, radix, policy):
    source, hf = tiny_llama
    vocab = source.config.vocab_size
    shared = random_prompts(1, vocab, 30, 30, seed=3)[0]
    prompts = [shared + tail for tail in random_prompts(16, vocab, 1, 25, seed=4)]
    scheduler = make_scheduler(
        "random:tiny-llama",
        source,
        chunked_prefill_size=8,
        disable_radix_cache=not radix,
        schedule_policy=policy,
    )
    results = run_to_completion(scheduler, prompts, greedy(NEW))
    check_against_hf(hf, prompts, results, NEW)
    info = scheduler.get_server_info()
    if radix:
        assert info["prefix_cache_hit_tokens"] > 0
    else:
        assert info["prefix_cache_hit_tokens"] == 0
    # every slot is back: free or held by the cache, none by a request
    assert info["protected_size"] == 0
    assert info["free_slots"] + info["evictable_size"] == info["max_total_tokens"]


def test_retraction_keeps_outputs_correct(tiny_llama, greedy):
    source, hf = tiny_llama
    prompts = random_prompts(16, source.config.vocab_size, 10, 30, seed=5)
    new = 40
    # room for every prompt but not for every request's 40 new tokens at once
    scheduler = make_scheduler("random:tiny-llama", source, max_total_tokens=600)
    results = run_to_completion(scheduler, prompts, greedy(new))
    assert scheduler.get_server_info()["num_retractions"] > 0
    check_against_hf(hf, prompts, results, new)


def test_repeated_prompt_reuses_prefix(tiny_llama, greedy):
    source, _ = tiny_llama
    prompt = random_prompts(1, source.config.vocab_size, 50, 50, seed=6)[0]
    scheduler = make_scheduler("random:tiny-llama", source)
    first = run_to_completion(scheduler, [prompt], greedy(NEW))
    computed = scheduler.get_server_info()["computed_prefill_tokens"]
    assert computed == len(prompt)
    second = run_to_completion(scheduler, [prompt], greedy(NEW))
    info = scheduler.get_server_info()
    # everything but the last prompt token came from the cache
    assert info["computed_prefill_tokens"] - computed == 1
    assert second["r0"]["cached"] == len(prompt) - 1
    assert second["r0"]["ids"] == first["r0"]["ids"]


def test_abort_frees_everything(tiny_llama, greedy):
    from radixserve.boundary import TokenizedGenerateReqInput

    source, _ = tiny_llama
    scheduler = make_scheduler("random:tiny-llama", source)
    for i, prompt in enumerate(random_prompts(6, source.config.vocab_size, 5, 30, seed=7)):
        scheduler.handle_generate_request(
            TokenizedGenerateReqInput(rid=f"a{i}", input_ids=prompt, sampling_params=greedy(50))
        )
    for _ in range(3):
        scheduler.step()
    for i in range(6):
        scheduler.abort_request(f"a{i}")
    while scheduler.has_work():
        scheduler.step()
    finishes = {o.rid: o.finished_reason for o in scheduler.pop_outputs() if o.finished_reason}
    assert finishes == {f"a{i}": {"type": "abort"} for i in range(6)}
    info = scheduler.get_server_info()
    assert info["protected_size"] == 0
    assert info["free_slots"] + info["evictable_size"] == info["max_total_tokens"]
    assert (
        scheduler.worker.model_runner.req_to_token_pool.available_size()
        == scheduler.worker.model_runner.req_to_token_pool.size
    )


def test_bad_input_ids_are_rejected_without_scheduling(tiny_llama, greedy):
    from radixserve.boundary import TokenizedGenerateReqInput

    source, _ = tiny_llama
    scheduler = make_scheduler("random:tiny-llama", source)
    vocab = source.config.vocab_size
    scheduler.handle_generate_request(
        TokenizedGenerateReqInput(rid="bad", input_ids=[1, vocab + 5], sampling_params=greedy(4))
    )
    scheduler.handle_generate_request(
        TokenizedGenerateReqInput(rid="empty", input_ids=[], sampling_params=greedy(4))
    )
    outs = {o.rid: o.finished_reason for o in scheduler.pop_outputs()}
    assert outs["bad"]["type"] == "error" and "input ids" in outs["bad"]["message"]
    assert outs["empty"]["type"] == "error"
    assert not scheduler.has_work()


def test_mixed_chunk_joins_running_decode(tiny_llama, greedy):
    """Requests arriving while others decode are prefilled in MIXED passes; outputs unchanged."""
    from radixserve.boundary import TokenizedGenerateReqInput

    source, hf = tiny_llama
    prompts = random_prompts(12, source.config.vocab_size, 5, 50, seed=8)
    scheduler = make_scheduler(
        "random:tiny-llama", source, enable_mixed_chunk=True, chunked_prefill_size=16
    )
    results: dict[str, list[int]] = {}

    def drain():
        for out in scheduler.pop_outputs():
            results.setdefault(out.rid, []).extend(out.new_token_ids)

    for i, prompt in enumerate(prompts):
        scheduler.handle_generate_request(
            TokenizedGenerateReqInput(rid=f"r{i}", input_ids=prompt, sampling_params=greedy(NEW))
        )
        scheduler.step()  # continuous batching: a new arrival every step
        drain()
    while scheduler.has_work():
        scheduler.step()
        drain()
    assert scheduler.get_server_info()["forward_steps_by_mode"]["mixed"] > 0
    for i, prompt in enumerate(prompts):
        assert results[f"r{i}"] == hf_greedy(hf, prompt, NEW), f"request {i} differs"


@pytest.mark.parametrize("mixed", [False, True], ids=["plain", "mixed"])
def test_overlap_bookkeeping_matches_transformers(tiny_llama, greedy, mixed):
    """Overlap scheduling resolves batch N after launching N+1 (future token ids, one-step-late
    stop checks, retraction of requests whose token is still in flight). On the CPU nothing runs
    asynchronously, but the bookkeeping is the same: force it on and check the outputs."""
    source, hf = tiny_llama
    prompts = random_prompts(16, source.config.vocab_size, 5, 40, seed=9)
    lengths = [0, 1, 2, 3] + [30] * 12
    scheduler = make_scheduler(
        "random:tiny-llama",
        source,
        max_total_tokens=520,
        chunked_prefill_size=16,
        enable_mixed_chunk=mixed,
    )
    scheduler.overlap = True
    results = run_to_completion(scheduler, prompts, [greedy(n) for n in lengths])
    info = scheduler.get_server_info()
    if mixed:
        assert info["forward_steps_by_mode"]["mixed"] > 0
    else:
        assert info["num_retractions"] > 0
    for i, prompt in enumerate(prompts):
        expected = hf_greedy(hf, prompt, lengths[i]) if lengths[i] else []
        assert results[f"r{i}"]["ids"] == expected, f"request {i} differs"
        assert results[f"r{i}"]["finish"] == {"type": "length"}
    info = scheduler.get_server_info()
    assert info["protected_size"] == 0
    assert info["free_slots"] + info["evictable_size"] == info["max_total_tokens"]
