"""DeepSeek V3 and V2-Lite layouts, greedy token-identical to transformers in float32 on the
same random weights: MLA over the latent pool (absorbed in decode, expanded in prefill), with
q-LoRA (V3) and without (V2-Lite), interleaved rotary dims and YaRN's softmax scale; dense
then MoE layers with shared experts, V3's sigmoid routing with the correction bias over
groups (renormalised, scaled) and V2-Lite's softmax greedy routing.

Requests run one at a time and all at once, with chunked prefill (8-token chunks, so prompts
and their cached prefixes cross chunks) and the radix cache on (half of the prompts share a
24-token prefix; then every prompt again, from the cache). And V3 as published: FP8
projections and experts with block scales (`weight_scale_inv`), a multi-token-prediction layer
after the last one (read and dropped), against transformers on the weights the loader computes
(test_fp8_checkpoints.py's checkpoint writer)."""

from __future__ import annotations

import json
import re

import pytest
import test_fp8_checkpoints
import torch
from engine_harness import check_against_hf, make_scheduler, random_prompts, run_to_completion
from safetensors.torch import load_file, save_file
from test_fp8_checkpoints import (
    projection_dtypes,
    quantize_tensor,
    run_parity,
    write_checkpoint,
)

from radixserve.layers.quantization.fp8 import FP8_DTYPE
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


def test_fp8_block_checkpoint_with_an_mtp_layer(tmp_path, monkeypatch):
    # every projection in FP8, kv_a_proj_with_mqa too, as V3's checkpoint has them
    quantized = re.compile(r"(_proj|_proj_with_mqa|experts\.\d+\.w[123])\.weight$")
    monkeypatch.setattr(test_fp8_checkpoints, "QUANTIZED", quantized)
    directory = tmp_path / "checkpoint"
    hf = write_checkpoint(directory, "tiny-deepseek-v3", "fp8-block")
    config = json.loads((directory / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (directory / "config.json").write_text(json.dumps(config))
    # V3's MTP layer as published: numbered after the last layer, its projections in FP8 too
    mtp = f"model.layers.{config['num_hidden_layers']}."
    hidden = config["hidden_size"]
    eh_proj, _ = quantize_tensor(
        f"{mtp}eh_proj.weight", torch.randn(hidden, 2 * hidden), "fp8-block"
    )
    extra = {f"{mtp}enorm.weight": torch.ones(hidden), f"{mtp}hnorm.weight": torch.ones(hidden)}
    tensors = load_file(directory / "model.safetensors")
    assert tensors["model.layers.1.self_attn.kv_a_proj_with_mqa.weight"].dtype == FP8_DTYPE
    assert tensors["model.layers.1.mlp.experts.0.gate_proj.weight"].dtype == FP8_DTYPE
    save_file(tensors | extra | eh_proj, directory / "model.safetensors")
    source = load_model_source(str(directory), device="cpu")
    scheduler = run_parity(str(directory), source, hf)
    assert projection_dtypes(scheduler) == {FP8_DTYPE}
    router = scheduler.worker.model_runner.model.model.layers[1].mlp.gate.weight
    assert router.dtype == torch.float32


def test_the_host_tier_mirrors_the_latent_pool(greedy):
    """A device pool too small for the prompts, and a host tier: the shared prefixes are
    evicted from the device by the long prompts after them and come back from host memory
    (the latent rows, copied through the pool's `kv_buffers()`), the tokens unchanged."""
    model = "random:tiny-deepseek-v3"
    source = load_model_source(model, device="cpu")
    vocab = source.config.vocab_size
    shared = random_prompts(1, vocab, 48, 48, seed=3)[0]
    prompts = [shared + tail for tail in random_prompts(6, vocab, 5, 30, seed=4)]
    prompts += random_prompts(10, vocab, 60, 90, seed=5)
    scheduler = make_scheduler(
        model, source, chunked_prefill_size=32, max_total_tokens=400, kv_host_memory=0.05
    )
    first = run_to_completion(scheduler, prompts, greedy(NEW))
    check_against_hf(build_hf_reference(source), prompts, first, NEW)
    again = run_to_completion(scheduler, prompts[:6], greedy(NEW))
    assert [again[f"r{i}"]["ids"] for i in range(6)] == [first[f"r{i}"]["ids"] for i in range(6)]
    assert all(again[f"r{i}"]["cached"] == len(p) - 1 for i, p in enumerate(prompts[:6]))
