"""FP8 on the GPU: the FP8 linear's paths (the batch-1 GEMV, torch._scaled_mm with per-token
activation scales) against the dequantized weight; the per-token quantization kernel; FP8 KV:
decode and extend attention in each GPU backend against the same batch in a bf16 pool, and
the token capacity of a memory budget doubling."""

from __future__ import annotations

import gc
import importlib.util

import pytest
import torch
import torch.nn.functional as F
from attention_cases import make_case, relative_error, run_backend
from small_models import SMALL_LLAMA, random_model

from radixserve.forward.mode import ForwardMode
from radixserve.layers.quantization.fp8 import (
    Fp8Linear,
    dequantize_rows,
    fp8_linear,
    quantize_per_token,
    quantize_rows,
)
from radixserve.model_executor.model_runner import ModelRunner
from radixserve.model_loader.loader import load_model_source
from radixserve.server_args import ServerArgs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
BACKENDS = ["triton"] + (["flashinfer"] if importlib.util.find_spec("flashinfer") else [])
# Llama-3-8B's projections (out, in)
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]


def fp8_weight(n: int, k: int, gen: torch.Generator):
    values, scale = quantize_rows(torch.randn(n, k, generator=gen).cuda() / k**0.5)
    return values, scale


@pytest.mark.parametrize("shape", SHAPES)
def test_batch_one_gemv_is_the_dequantized_product(shape):
    gen = torch.Generator().manual_seed(0)
    values, scale = fp8_weight(*shape, gen)
    x = torch.randn(1, shape[1], generator=gen).cuda().to(torch.bfloat16)
    ref = F.linear(x.double(), dequantize_rows(values, scale, torch.float64))
    assert relative_error(fp8_linear(x, values, scale), ref) < 1e-2


@pytest.mark.parametrize("rows", [2, 64, 300])
@pytest.mark.parametrize("shape", SHAPES)
def test_scaled_mm_with_per_token_scales(shape, rows):
    """FP8 x FP8 on the tensor cores: the activations' own rounding to e4m3 is the error
    (a few percent relative), against the dequantized weight in float64."""
    gen = torch.Generator().manual_seed(rows)
    values, scale = fp8_weight(*shape, gen)
    x = torch.randn(rows, shape[1], generator=gen).cuda().to(torch.bfloat16)
    bias = torch.randn(shape[0], generator=gen).cuda().to(torch.bfloat16)
    out = fp8_linear(x, values, scale, bias)
    ref = F.linear(x.double(), dequantize_rows(values, scale, torch.float64), bias.double())
    assert out.dtype == torch.bfloat16 and out.shape == (rows, shape[0])
    assert relative_error(out, ref) < 4e-2


def test_per_token_quantization_kernel_matches_torch():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(37, 5000, generator=gen).cuda().to(torch.bfloat16)
    x[3] = 0.0  # a zero row still gets a positive scale
    x[5] *= 1000.0
    q, scale = quantize_per_token(x)
    ref_q, ref_scale = quantize_rows(x)
    assert torch.allclose(scale[:, 0], ref_scale, rtol=1e-6)
    assert (q.float() - ref_q.float()).abs().max() <= 32.0  # at most one step (at 256..448)


def test_fp8_linear_layer_loads_and_multiplies():
    gen = torch.Generator().manual_seed(2)
    with torch.device("cuda"):
        layer = Fp8Linear(4096, 1024, bias=False)
    w = torch.randn(1024, 4096, generator=gen).cuda().to(torch.bfloat16) / 64
    layer.load_rows("weight", 0, 1024, w)
    for rows in (1, 16):
        x = torch.randn(rows, 4096, generator=gen).cuda().to(torch.bfloat16)
        assert relative_error(layer(x), F.linear(x.double(), w.double())) < 5e-2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.EXTEND])
def test_fp8_kv_attention_against_bf16_kv(backend, mode):
    """One batch, the same K/V values, in a bf16 pool and in an FP8 pool with per-tensor
    scales: outputs within FP8's rounding (e4m3: 2**-4 relative per value)."""
    from test_attention_backends import _backend_class

    cls = _backend_class(backend)
    prefix = [700, 33, 1500, 5] if mode.is_decode() else [300, 0, 64]
    extend = [1] * 4 if mode.is_decode() else [40, 120, 7]
    out = {}
    for kv_dtype in (torch.bfloat16, torch.float8_e4m3fn):
        gen = torch.Generator().manual_seed(3)  # same draws: same q, k, v and layout
        case = make_case(
            mode, prefix, extend, 32, 8, 128, torch.bfloat16, "cuda", gen,
            kv_dtype=kv_dtype, kv_scales=(2**-2, 2**-3),
        )  # fmt: skip
        if kv_dtype == torch.bfloat16:
            bf16_pool = case.forward_batch.token_to_kv_pool
        else:  # the bf16 pool's values, quantized with the scales
            pool = case.forward_batch.token_to_kv_pool
            k_scale, v_scale = pool.scales(0)
            pool.k_buffers[0].copy_((bf16_pool.k_buffers[0].float() / k_scale).to(pool.dtype))
            pool.v_buffers[0].copy_((bf16_pool.v_buffers[0].float() / v_scale).to(pool.dtype))
        out[kv_dtype] = run_backend(cls(case.context), case)
    err = relative_error(out[torch.float8_e4m3fn], out[torch.bfloat16])
    assert 0 < err < 5e-2, err


def test_fp8_kv_doubles_the_token_capacity(tmp_path):
    model = random_model(tmp_path, "small-llama", SMALL_LLAMA)
    capacity = {}
    for kv in ("auto", "fp8_e4m3"):
        # the budget is what is free when the runner starts: each starts with the caching
        # allocator emptied, of the tests before as of the runner before
        gc.collect()
        torch.cuda.empty_cache()
        args = ServerArgs(
            model=model,
            device="cuda",
            dtype="bfloat16",
            kv_cache_dtype=kv,
            mem_fraction_static=0.3,
            disable_cuda_graph=True,
            max_running_requests=8,
        )
        runner = ModelRunner(args, load_model_source(model, dtype="bfloat16", device="cuda"))
        capacity[kv] = runner.max_total_tokens
        assert runner.token_to_kv_pool.k_buffers[0].dtype == runner.kv_dtype
        del runner
    ratio = capacity["fp8_e4m3"] / capacity["auto"]
    print(f"KV capacity: bf16 {capacity['auto']} tokens, fp8 {capacity['fp8_e4m3']} ({ratio:.3f}x)")
    assert 1.95 <= ratio <= 2.05
