"""DeepSeek V3 and V2-Lite layouts, greedy token-identical to transformers in float32 on the
same random weights: MLA over the latent pool (absorbed in decode, expanded in prefill), with
q-LoRA (V3) and without (V2-Lite), interleaved rotary dims and YaRN's softmax scale; dense
then MoE layers with shared experts, V3's sigmoid routing with the correction bias over
groups (renormalised, scaled) and V2-Lite's softmax greedy routing.

Requests run one at a time and all at once, with chunked prefill (8-token chunks, so prompts
and their cached prefixes cross chunks) and the radix cache on (half of the prompts share a
24-token prefix; then every prompt again, from the cache)."""

from __future__ import annotations

import pytest
from engine_harness import check_against_hf, make_scheduler, random_prompts, run_to_completion

from radixserve.mem_cache.mla_memory_pool import MLATokenToKVPool
from radixserve.model_loader.loader import build_hf_reference, load_model_source

pytestmark = pytest.mark.slow
NEW = 8
LAYOUTS = ["tiny-deepseek-v3", "tiny-deepseek-v2-lite"]


@pytest.fixture(scope="module", params=LAYOUTS)
def layout(request):
    model = f"random:{request.param}"
    source = load_model_source(model, device="cpu")
    return model, source, build_hf_reference(source)


def test_the_pool_holds_one_latent_row_per_token(layout):
    model, source, _ = layout
    scheduler = make_scheduler(model, source)
    runner = scheduler.worker.model_runner
    pool = runner.token_to_kv_pool
    cfg = source.config.hf_config
    width = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    assert isinstance(pool, MLATokenToKVPool)
    assert [tuple(b.shape) for b in pool.kv_buffers()] == [
        (runner.max_total_tokens + 1, 1, width)
    ] * cfg.num_hidden_layers
    # not heads x (key + value): 4 heads x (24 + 16) = 160 values a layer would be 4x more
    assert runner.kv_bytes_per_token == cfg.num_hidden_layers * width * 4


def test_one_request_at_a_time_matches_transformers(layout, greedy):
    model, source, hf = layout
    prompts = random_prompts(3, source.config.vocab_size, 3, 40, seed=50)
    scheduler = make_scheduler(model, source, chunked_prefill_size=8)
    for prompt in prompts:
        check_against_hf(hf, [prompt], run_to_completion(scheduler, [prompt], greedy(NEW)), NEW)


def test_concurrent_chunked_radix_requests_match_transformers(layout, greedy):
    model, source, hf = layout
    vocab = source.config.vocab_size
    shared = random_prompts(1, vocab, 24, 24, seed=60)[0]
    prompts = [shared + tail for tail in random_prompts(6, vocab, 1, 20, seed=61)]
    prompts += random_prompts(6, vocab, 2, 40, seed=62)
    scheduler = make_scheduler(model, source, chunked_prefill_size=8)
    first = run_to_completion(scheduler, prompts, greedy(NEW))
    check_against_hf(hf, prompts, first, NEW)
    assert scheduler.get_server_info()["prefix_cache_hit_tokens"] > 0

    again = run_to_completion(scheduler, prompts, greedy(NEW))
    assert {rid: r["ids"] for rid, r in again.items()} == {
        rid: r["ids"] for rid, r in first.items()
    }
    assert all(again[f"r{i}"]["cached"] == len(p) - 1 for i, p in enumerate(prompts))
