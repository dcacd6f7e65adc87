"""FP8 weights and KV on the CPU: per-channel quantization, the FP8 linear's loading of every
checkpoint form (bf16 to quantize, FP8 with per-tensor or per-channel scales, block scales),
the choice of method from a config and --quantization, and the FP8 KV pool."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixserve.catalog.quantization_methods import UnsupportedQuantizationError
from radixserve.layers.quantization.base import make_linear, resolve_quantization
from radixserve.layers.quantization.fp8 import (
    FP8_DTYPE,
    Fp8Config,
    Fp8Linear,
    dequantize_blocks,
    dequantize_rows,
    quantize_per_token,
    quantize_rows,
)
from radixserve.mem_cache.memory_pool import TokenToKVPool
from radixserve.model_executor.model_runner import kv_cache_dtype


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def test_rows_quantize_to_their_own_scale(gen):
    w = torch.randn(24, 40, generator=gen) * torch.logspace(-3, 2, 24)[:, None]
    values, scale = quantize_rows(w)
    assert values.dtype == FP8_DTYPE and scale.shape == (24,) and scale.dtype == torch.float32
    # each row's largest magnitude lands on the format's largest value
    assert torch.equal(values.float().abs().amax(-1), torch.full((24,), 448.0))
    err = (dequantize_rows(values, scale, torch.float32) - w).abs().amax(-1)
    assert (err <= w.abs().amax(-1) * 2**-4).all()  # half a step of a 3-bit mantissa
    zeros, zero_scale = quantize_rows(torch.zeros(2, 8))
    assert (zero_scale > 0).all() and (zeros.float() == 0).all()


def test_per_token_activation_scales(gen):
    x = torch.randn(5, 64, generator=gen) * torch.tensor([1e-3, 1.0, 10.0, 300.0, 1.0])[:, None]
    q, scale = quantize_per_token(x)
    assert q.dtype == FP8_DTYPE and scale.shape == (5, 1)
    assert torch.allclose(scale[:, 0], x.abs().amax(-1) / 448.0)


def test_linear_quantizes_a_bf16_weight_at_load(gen):
    layer = Fp8Linear(32, 12, bias=True)
    w, b = torch.randn(12, 32, generator=gen), torch.randn(12, generator=gen)
    assert layer.load_rows("weight", 0, 12, w) == {"weight", "weight_scale"}
    assert layer.load_rows("bias", 0, 12, b) == {"bias"}
    values, scale = quantize_rows(w)
    assert torch.equal(layer.weight.float(), values.float())
    assert torch.equal(layer.weight_scale, scale)
    x = torch.randn(3, 32, generator=gen)
    # the CPU product is the dequantized weight's, exactly
    assert torch.equal(layer(x), F.linear(x, dequantize_rows(values, scale, x.dtype), b))


def test_linear_takes_fp8_rows_with_their_scales(gen):
    """A fused projection whose shards come with a per-tensor scale (one value for its rows)
    and a per-channel one ([rows, 1]), in whichever order the checkpoint lists them."""
    layer = Fp8Linear(16, 10, bias=False)
    first = torch.randn(4, 16, generator=gen).to(FP8_DTYPE)
    second = torch.randn(6, 16, generator=gen).to(FP8_DTYPE)
    assert layer.load_rows("weight_scale", 0, 4, torch.tensor(0.25)) == {"weight_scale"}
    assert layer.load_rows("weight", 0, 4, first) == {"weight"}
    assert layer.load_rows("weight", 4, 6, second) == {"weight"}
    channel = torch.arange(1, 7, dtype=torch.float32)[:, None]
    layer.load_rows("weight_scale", 4, 6, channel)
    assert layer.load_rows("input_scale", 0, 4, torch.tensor(3.0)) == set()
    expected = torch.cat([first.float() * 0.25, second.float() * channel])
    assert torch.equal(dequantize_rows(layer.weight, layer.weight_scale, torch.float32), expected)
    with pytest.raises(ValueError, match="fits neither"):
        layer.load_rows("weight_scale", 0, 4, torch.ones(3))
    with pytest.raises(ValueError, match="rows"):
        layer.load_rows("weight", 0, 4, second)


def test_block_scales_are_applied_to_their_blocks(gen):
    values = torch.randn(20, 36, generator=gen).to(FP8_DTYPE)
    scale = torch.rand(2, 3, generator=gen) + 0.5  # 16 x 16 blocks, partial at the edges
    dense = dequantize_blocks(values, scale, (16, 16))
    assert torch.equal(dense[:16, :16], values[:16, :16].float() * scale[0, 0])
    assert torch.equal(dense[16:, 32:], values[16:, 32:].float() * scale[1, 2])

    config = Fp8Config("fp8", (16, 16))
    stream = [
        ("a.weight_scale_inv", scale),  # the scale may come first
        ("norm.weight", torch.ones(3)),
        ("a.weight", values),
        ("b.weight", values),
        ("b.weight_scale_inv", scale),
    ]
    out = dict(config.adapt_checkpoint(iter(stream)))
    assert set(out) == {"a.weight", "b.weight", "norm.weight"}
    assert torch.equal(out["a.weight"], dense) and torch.equal(out["b.weight"], dense)
    with pytest.raises(ValueError, match="unpaired"):
        list(config.adapt_checkpoint(iter([("c.weight", values)])))
    # per-tensor HF FP8: only the scale's name changes (it is a multiplier, despite "inv")
    per_tensor = Fp8Config("fp8", None).adapt_checkpoint(iter([("c.weight_scale_inv", scale)]))
    assert [name for name, _ in per_tensor] == ["c.weight_scale"]


class Config:
    def __init__(self, quantization_config=None):
        if quantization_config is not None:
            self.quantization_config = quantization_config


def test_method_from_flag_and_checkpoint():
    assert resolve_quantization(Config(), None) is None
    at_load = resolve_quantization(Config(), "fp8")
    assert isinstance(at_load, Fp8Config) and at_load.checkpoint_format is None
    assert isinstance(make_linear(8, 4, False, at_load), Fp8Linear)
    assert not isinstance(make_linear(8, 4, False, None), Fp8Linear)
    blocks = resolve_quantization(
        Config({"quant_method": "fp8", "weight_block_size": [128, 128]}), None
    )
    assert blocks.block_size == (128, 128)
    channel = {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}
    ct = resolve_quantization(
        Config({"quant_method": "compressed-tensors", "config_groups": {"g": channel}}), "fp8"
    )
    assert ct.checkpoint_format == "compressed-tensors"


@pytest.mark.parametrize(
    ("config", "flag", "message"),
    [
        ({"quant_method": "awq"}, None, "'awq'; supported: fp8, compressed-tensors"),
        ({"quant_method": "gptq"}, "fp8", "'gptq'"),
        (None, "int8", "'int8'; supported: fp8"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}},
            },
            None,
            "4-bit int",
        ),
    ],
)
def test_unsupported_methods_are_named(config, flag, message):
    with pytest.raises(UnsupportedQuantizationError, match=message):
        resolve_quantization(Config(config), flag)


def test_fp8_kv_pool_halves_the_bytes_and_keeps_values(gen):
    assert kv_cache_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert kv_cache_dtype("fp8_e4m3", torch.bfloat16) == torch.float8_e4m3fn
    bf16 = TokenToKVPool.bytes_per_token(32, 8, 128, torch.bfloat16)
    assert TokenToKVPool.bytes_per_token(32, 8, 128, torch.float8_e4m3fn) * 2 == bf16

    pool = TokenToKVPool(16, 2, 2, 8, torch.float8_e4m3fn, "cpu")
    assert pool.is_fp8 and pool.scales(1) == (1.0, 1.0)
    pool.set_scales(1, 0.5, 4.0)
    k = torch.randn(3, 2, 8, generator=gen)
    v = torch.randn(3, 2, 8, generator=gen) * 1000  # past 448 * 4: saturates, no inf
    loc = torch.tensor([2, 5, 9])
    pool.set_kv_buffer(1, loc, k, v)
    k_back, v_back = pool.read_kv(1, loc, torch.float32)
    assert torch.allclose(k_back, k, rtol=2**-4, atol=0.5 * 2**-9)
    assert torch.isfinite(v_back).all() and v_back.abs().max() <= 448 * 4.0
    assert torch.equal(pool.k_buffers[1][loc].float() * 0.5, k_back)
    with pytest.raises(ValueError, match="positive"):
        pool.set_scales(0, 0.0, 1.0)
