"""gpt-oss on the CPU, greedy token-identical to transformers in float32, from a checkpoint in
the published layout: the experts in MXFP4 (blocks + scales, gate and up rows interleaved,
quantized here), everything else in float; transformers holds the same dequantized weights.

The tiny model has what makes gpt-oss itself: attention sinks (random, so they take a real
share of every softmax), sliding (16-token) and full layers alternating, YaRN RoPE, q/k/v/o
biases, and experts with biases and the clamped SwiGLU, its limit in play. Requests run one at
a time and all at once, with chunked prefill (8-token chunks) and the radix cache (a shared
24-token prefix, longer than the window, then every prompt again from the cache)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from engine_harness import (
    check_against_hf,
    greedy,
    make_scheduler,
    random_prompts,
    run_to_completion,
)
from safetensors.torch import save_file

from radixserve.frontend.engine import Engine
from radixserve.layers.quantization.mxfp4 import (
    E2M1_VALUES,
    GROUP,
    dequantize_mxfp4,
    quantize_mxfp4,
)
from radixserve.model_loader.loader import build_hf_reference, load_model_source

pytestmark = pytest.mark.slow
NEW = 8
WINDOW = 16  # the preset's sliding window


def test_mxfp4_quantizer_round_trips_its_own_grid():
    """The loader's quantizer inverts its dequantizer on values of the grid, and values it
    decoded quantize again to the same values (so a checkpoint's experts pass a load that
    keeps them in MXFP4 unchanged; a group's scale may come out finer where its largest
    value is small for its scale)."""
    gen = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 16, (3, 4, 64), generator=gen)
    exponents = torch.randint(-6, 3, (3, 4, 2, 1), generator=gen).float()
    grid = torch.tensor(E2M1_VALUES)[codes].unflatten(-1, (2, GROUP))
    grid[..., 0] = 6.0  # every group holds a 6, so its scale is exactly its exponent
    weight = (grid * torch.exp2(exponents)).flatten(-2)
    blocks, scales = quantize_mxfp4(weight)
    assert torch.equal(dequantize_mxfp4(blocks, scales, torch.float32), weight)
    random = torch.randn(5, 96, generator=gen)
    blocks, scales = quantize_mxfp4(random)
    decoded = dequantize_mxfp4(blocks, scales, torch.bfloat16)
    assert torch.equal(dequantize_mxfp4(*quantize_mxfp4(decoded), torch.bfloat16), decoded)
    # at most half the widest e2m1 gap (1, between 4 and 6) times a scale below amax / 3
    assert ((decoded.float() - random).abs() <= random.abs().amax() / 3).all()


def write_mxfp4_checkpoint(directory: Path):
    """(checkpoint directory, transformers model holding its dequantized weights)."""
    source = load_model_source("random:tiny-gpt-oss", device="cpu")
    hf = build_hf_reference(source)
    hf.config._attn_implementation = "eager"  # the reference with sinks
    gen = torch.Generator().manual_seed(7)
    tensors = {}
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith("self_attn.sinks"):
                param.copy_(torch.randn(param.shape, generator=gen))
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                # transformers' [E, K, N] -> the checkpoint's [E, N, K], large enough to clamp
                stored = (torch.randn(param.shape, generator=gen) * 0.3).transpose(1, 2)
                blocks, scales = quantize_mxfp4(stored)
                tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
                param.copy_(dequantize_mxfp4(blocks, scales, torch.float32).transpose(1, 2))
            elif name.endswith("_proj_bias"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
                tensors[name] = param.detach().clone()
            else:
                tensors[name] = param.detach().clone()
    directory.mkdir()
    save_file(tensors, directory / "model.safetensors")
    config = hf.config.to_dict()
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": []}
    config["architectures"] = ["GptOssForCausalLM"]
    (directory / "config.json").write_text(json.dumps(config))
    return hf


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpt-oss") / "checkpoint"
    hf = write_mxfp4_checkpoint(directory)
    return str(directory), load_model_source(str(directory), device="cpu"), hf


def test_layers_alternate_windows_and_experts_clamp(checkpoint):
    model, source, hf = checkpoint
    assert source.config.sliding_windows == (WINDOW, -1, WINDOW)
    # the clamp bites: some gate pre-activations of the first layer pass the limit
    layer = hf.model.layers[0]
    limit = hf.config.swiglu_limit
    x = torch.randn(32, hf.config.hidden_size, generator=torch.Generator().manual_seed(2))
    gate_up = x @ layer.mlp.experts.gate_up_proj[0] + layer.mlp.experts.gate_up_proj_bias[0]
    assert (gate_up[:, 0::2] > limit).float().mean() > 0.05


def test_one_at_a_time_and_all_at_once_match_transformers(checkpoint):
    model, source, hf = checkpoint
    vocab = source.config.vocab_size
    shared = random_prompts(1, vocab, 24, 24, seed=40)[0]
    prompts = [shared + tail for tail in random_prompts(6, vocab, 1, 30, seed=41)]
    prompts += random_prompts(6, vocab, 2, 50, seed=42)
    assert max(len(p) for p in prompts) > 2 * WINDOW
    scheduler = make_scheduler(model, source, chunked_prefill_size=8)
    alone = {}
    for i, prompt in enumerate(prompts[:4]):
        alone[f"r{i}"] = run_to_completion(scheduler, [prompt], greedy(NEW))["r0"]
    check_against_hf(hf, prompts[:4], alone, NEW)
    scheduler.flush_cache()
    together = run_to_completion(scheduler, prompts, greedy(NEW))
    check_against_hf(hf, prompts, together, NEW)
    assert scheduler.get_server_info()["prefix_cache_hit_tokens"] > 0
    again = run_to_completion(scheduler, prompts, greedy(NEW))
    assert {rid: r["ids"] for rid, r in again.items()} == {
        rid: r["ids"] for rid, r in together.items()
    }
    assert all(again[f"r{i}"]["cached"] == len(p) - 1 for i, p in enumerate(prompts))


def test_quantization_fp8_requantizes_the_dequantized_experts(checkpoint):
    """--quantization fp8 on the MXFP4 checkpoint: the experts (and projections) in FP8 with
    channel scales, the router and sinks in float; greedy tokens as transformers' on the
    weights FP8 leaves."""
    from radixserve.layers.quantization.fp8 import FP8_DTYPE, dequantize_rows, quantize_rows

    model, source, hf = checkpoint
    reference = copy.deepcopy(hf)
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if name.endswith("_proj.weight"):
                param.copy_(dequantize_rows(*quantize_rows(param), torch.float32))
            elif name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                # the layer quantizes [E, N, K] rows of the bf16-dequantized values
                rows = param.transpose(1, 2).to(torch.bfloat16)
                param.copy_(dequantize_rows(*quantize_rows(rows), torch.float32).transpose(1, 2))
    prompts = random_prompts(4, source.config.vocab_size, 3, 40, seed=60)
    scheduler = make_scheduler(model, source, chunked_prefill_size=16, quantization="fp8")
    check_against_hf(reference, prompts, run_to_completion(scheduler, prompts, greedy(NEW)), NEW)
    runner_model = scheduler.worker.model_runner.model
    assert runner_model.model.layers[0].mlp.experts.w13_weight.dtype == FP8_DTYPE
    assert runner_model.model.layers[0].mlp.router.weight.dtype == torch.float32


def test_quantization_mxfp4_keeps_the_checkpoints_experts(checkpoint):
    """--quantization mxfp4: the experts stay MXFP4 (the checkpoint's own bytes: its values
    quantize back to themselves), the rest float; the same tokens as transformers."""
    model, source, hf = checkpoint
    prompts = random_prompts(4, source.config.vocab_size, 3, 40, seed=62)
    scheduler = make_scheduler(model, source, chunked_prefill_size=16, quantization="mxfp4")
    check_against_hf(hf, prompts, run_to_completion(scheduler, prompts, greedy(NEW)), NEW)
    experts = scheduler.worker.model_runner.model.model.layers[0].mlp.experts
    assert experts.w13_weight.dtype == experts.w13_weight_scale.dtype == torch.uint8
    assert scheduler.get_server_info()["quantization"].startswith("mxfp4")


def test_quantization_mxfp4_quantizes_float_experts_at_load():
    """--quantization mxfp4 on float weights (random ones, as the GPU benchmark loads):
    the experts quantized at load, 32 values a scale; transformers on the decoded values."""
    model = "random:tiny-gpt-oss"
    source = load_model_source(model, device="cpu")
    hf = build_hf_reference(source)
    hf.config._attn_implementation = "eager"
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                stored = param.transpose(1, 2)  # [E, N, K], as the layer quantizes it
                decoded = dequantize_mxfp4(*quantize_mxfp4(stored), torch.float32)
                param.copy_(decoded.transpose(1, 2))
    prompts = random_prompts(3, source.config.vocab_size, 3, 40, seed=63)
    scheduler = make_scheduler(model, source, chunked_prefill_size=16, quantization="mxfp4")
    check_against_hf(hf, prompts, run_to_completion(scheduler, prompts, greedy(NEW)), NEW)


def test_quantization_mxfp4_is_refused_for_other_architectures():
    from radixserve.catalog.quantization_methods import UnsupportedQuantizationError
    from radixserve.catalog.servable import check_servable

    with pytest.raises(UnsupportedQuantizationError, match="GptOssForCausalLM only"):
        check_servable({"model_type": "llama"}, "mxfp4")


def test_two_ranks_shard_sinks_biases_and_experts(checkpoint):
    """--tp-size 2 (gloo): each rank its query heads' sinks, its rows of every expert and of
    their gate/up biases, the down biases added once; the same tokens as transformers."""
    model, source, hf = checkpoint
    prompts = random_prompts(4, source.config.vocab_size, 3, 40, seed=61)
    greedy_params = {"max_new_tokens": NEW, "temperature": 0.0, "ignore_eos": True}
    with Engine(model=model, device="cpu", tp_size=2, max_total_tokens=4096) as engine:
        outputs = engine.generate(input_ids=prompts, sampling_params=greedy_params)
    results = {f"r{i}": {"ids": out["output_ids"]} for i, out in enumerate(outputs)}
    check_against_hf(hf, prompts, results, NEW)
