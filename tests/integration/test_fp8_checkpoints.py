"""FP8 models on the CPU (dequantized there), greedy token-identical to transformers holding
the same effective weights in float32:

- `--quantization fp8` on an unquantized checkpoint: every projection (and every expert)
  quantized at load, one scale per output channel;
- pre-quantized checkpoints written here as a user would download them (config.json with the
  quantization_config, safetensors with FP8 weights and their scales): Hugging Face `fp8` with
  a per-tensor scale and with 16 x 16 blocks, and compressed-tensors float-quantized with
  per-channel and per-tensor scales (static input scales present, and ignored: activations are
  quantized per token);
- a Qwen3-MoE compressed-tensors checkpoint: FP8 experts, the router left in float.

The reference's weights are what the checkpoint's values times its scales are (block-wise
ones then re-quantized per channel, as the loader does), so any slip in reading names, scales
or shards shows as different tokens.
"""

from __future__ import annotations

import json
import re
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
from safetensors.torch import load_file, save_file

from radixserve.layers.quantization.fp8 import (
    FP8_DTYPE,
    dequantize_blocks,
    dequantize_rows,
    quantize_rows,
)
from radixserve.model_loader.loader import build_hf_reference, load_model_source

pytestmark = pytest.mark.slow
NEW = 8
BLOCK = 16
# checkpoint tensors a quantized checkpoint stores in FP8: projections and experts, not the
# router (mlp.gate), the norms, the embedding or the LM head
QUANTIZED = re.compile(r"(_proj|experts\.\d+\.w[123])\.weight$")
CT_CHANNEL = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}
CT_TENSOR = {**CT_CHANNEL, "strategy": "tensor"}
CT_INPUT = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}


def quantization_config(fmt: str) -> dict:
    if fmt == "fp8-tensor":
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": None}
    if fmt == "fp8-block":
        return {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "weight_block_size": [BLOCK] * 2,
        }
    weights = CT_CHANNEL if fmt == "ct-channel" else CT_TENSOR
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": weights, "input_activations": CT_INPUT}
        },
        "ignore": ["lm_head"],
    }


def quantize_tensor(name: str, w: torch.Tensor, fmt: str) -> tuple[dict, torch.Tensor]:
    """The checkpoint tensors for one weight, and the float32 weight the loader ends up with."""
    w = w.float()
    base = name.removesuffix(".weight")
    if fmt == "fp8-block":
        rows, cols = -(-w.shape[0] // BLOCK), -(-w.shape[1] // BLOCK)
        padded = torch.zeros(rows * BLOCK, cols * BLOCK)
        padded[: w.shape[0], : w.shape[1]] = w
        blocks = padded.view(rows, BLOCK, cols, BLOCK)
        scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-12)
        expanded = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
        values = (padded / expanded)[: w.shape[0], : w.shape[1]].to(FP8_DTYPE)
        effective = dequantize_rows(
            *quantize_rows(dequantize_blocks(values, scale, (BLOCK, BLOCK))), torch.float32
        )
        return {name: values, f"{base}.weight_scale_inv": scale}, effective
    if fmt in ("fp8-tensor", "ct-tensor"):
        scale = (w.abs().max() / 448.0).reshape(1 if fmt == "ct-tensor" else ())
        values = (w / scale).to(FP8_DTYPE)
        scale_name = "weight_scale_inv" if fmt == "fp8-tensor" else "weight_scale"
        tensors = {name: values, f"{base}.{scale_name}": scale}
        effective = values.float() * scale
    else:  # ct-channel
        values, scale = quantize_rows(w)
        tensors = {name: values, f"{base}.weight_scale": scale[:, None]}
        effective = dequantize_rows(values, scale, torch.float32)
    if fmt.startswith("ct"):
        tensors[f"{base}.input_scale"] = torch.tensor([0.05])
    return tensors, effective


def write_checkpoint(directory: Path, preset: str, fmt: str):
    """A quantized checkpoint of `random:preset`'s weights, and transformers holding the
    weights the loader will compute from it."""
    hf = build_hf_reference(load_model_source(f"random:{preset}", device="cpu"))
    hf.save_pretrained(directory)
    tensors = load_file(directory / "model.safetensors")
    quantized, effective = {}, {}
    for name, w in tensors.items():
        if QUANTIZED.search(name):
            stored, effective[name] = quantize_tensor(name, w, fmt)
            quantized |= stored
        else:
            quantized[name] = w
    save_file(quantized, directory / "model.safetensors")
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"] = quantization_config(fmt)
    (directory / "config.json").write_text(json.dumps(config))
    # the reference: the same model with the effective weights, loaded the way transformers
    # reads a checkpoint (its own expert-stacking conversion included)
    reference_dir = directory.parent / f"{directory.name}-reference"
    hf.save_pretrained(reference_dir)
    plain = load_file(reference_dir / "model.safetensors") | effective
    save_file(plain, reference_dir / "model.safetensors")
    return type(hf).from_pretrained(reference_dir, dtype=torch.float32).eval()


def run_parity(model: str, source, hf, **kwargs) -> object:
    prompts = random_prompts(6, source.config.vocab_size, 3, 40, seed=60)
    scheduler = make_scheduler(model, source, chunked_prefill_size=16, **kwargs)
    results = run_to_completion(scheduler, prompts, greedy(NEW))
    check_against_hf(hf, prompts, results, NEW)
    return scheduler


def projection_dtypes(scheduler) -> set[torch.dtype]:
    model = scheduler.worker.model_runner.model
    return {
        p.dtype
        for name, p in model.named_parameters()
        if name.endswith(("proj.weight", "w13_weight", "w2_weight"))
    }


@pytest.mark.parametrize("fmt", ["fp8-tensor", "fp8-block", "ct-channel", "ct-tensor"])
def test_dense_fp8_checkpoint(tmp_path, fmt):
    directory = tmp_path / "checkpoint"
    hf = write_checkpoint(directory, "tiny-llama", fmt)
    source = load_model_source(str(directory), device="cpu")
    scheduler = run_parity(str(directory), source, hf)
    assert projection_dtypes(scheduler) == {FP8_DTYPE}
    info = scheduler.get_server_info()
    assert info["quantization"].startswith("fp8 (")


def test_moe_fp8_checkpoint(tmp_path):
    directory = tmp_path / "checkpoint"
    hf = write_checkpoint(directory, "tiny-qwen3-moe", "ct-channel")
    source = load_model_source(str(directory), device="cpu")
    scheduler = run_parity(str(directory), source, hf)
    assert projection_dtypes(scheduler) == {FP8_DTYPE}
    router = scheduler.worker.model_runner.model.model.layers[0].mlp.gate.weight
    assert router.dtype == torch.float32


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-mixtral"])
def test_quantization_flag_quantizes_at_load(preset):
    """--quantization fp8 on float weights: per-channel e4m3 of every projection and expert."""
    model = f"random:{preset}"
    source = load_model_source(model, device="cpu")
    hf = build_hf_reference(source)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith(("_proj.weight", "experts.gate_up_proj", "experts.down_proj")):
                param.copy_(dequantize_rows(*quantize_rows(param), torch.float32))
    scheduler = run_parity(model, source, hf, quantization="fp8")
    assert projection_dtypes(scheduler) == {FP8_DTYPE}
    assert scheduler.get_server_info()["quantization"] == "fp8 (quantized at load, per channel)"
