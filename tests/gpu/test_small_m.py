"""The 2-16 row projection kernel (kernels/small_m.py) on the GPU: the Llama-3-8B projections
in bf16/fp16 and FP8 against float32/float64 references (no worse than cuBLAS in the same
dtype), the gated epilogue, rows that do not depend on the batch's padding, one compile for
every row count, replay in CUDA graphs at the captured sizes, and an 8B-shaped model's decode
graphs at batch 2-16 taking it for every projection."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from small_models import random_model

from radixserve.kernels import fused_ops, small_m
from radixserve.layers.linear import linear, linear_silu_and_mul
from radixserve.layers.quantization.fp8 import Fp8Linear, dequantize_rows, quantize_rows

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# Llama-3-8B's qkv, o, gate_up, down; a ragged shape (no multiple of any block)
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (100, 4000)]
ROWS = [2, 5, 8, 16]


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", SHAPES)
def test_small_m_as_accurate_as_cublas(n, k, dtype):
    torch.manual_seed(n + k)
    w = (torch.randn(n, k, device="cuda") * 0.02).to(dtype)
    b = torch.randn(n, device="cuda").to(dtype)
    for m in ROWS:
        x = torch.randn(m, k, device="cuda").to(dtype)
        assert small_m.uses_small_m(x, w)
        ref = F.linear(x.float(), w.float(), b.float())
        ours = linear(x, w, b)
        assert ours.shape == (m, n) and ours.dtype == dtype
        # one rounding of a float32 sum: at most the half-precision output rounding, like cuBLAS
        assert rel_err(ours, ref) <= max(1.5 * rel_err(F.linear(x, w, b), ref), 1e-3), m


def test_lm_head_logits_are_the_widened_product():
    """The LM head's float32 output holds exactly `.float()` of the bf16 product."""
    w = (torch.randn(128256, 4096, device="cuda") * 0.02).to(torch.bfloat16)
    for m in (2, 8):
        x = torch.randn(m, 4096, device="cuda").to(torch.bfloat16)
        wide = linear(x, w, out_dtype=torch.float32)
        assert wide.dtype == torch.float32
        assert torch.equal(wide, linear(x, w).float())
        assert rel_err(wide, F.linear(x.float(), w.float())) < 1e-2


@pytest.mark.parametrize("n,k", [(28672, 4096), (2 * 1000, 300)])
def test_gated_is_the_product_then_the_activation(n, k):
    """silu(gate) * up from one launch: as accurate as the product followed by the activation
    kernel, which rounds the same sums and computes the same float32 formula."""
    torch.manual_seed(n)
    w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
    b = (torch.randn(n, device="cuda") * 0.1).to(torch.bfloat16)
    for m in ROWS:
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = F.linear(x.float(), w.float(), b.float())
        ref = F.silu(ref[:, : n // 2]) * ref[:, n // 2 :]
        ours = linear_silu_and_mul(x, w, b)
        two_kernels = fused_ops.silu_and_mul(F.linear(x, w, b))
        assert ours.shape == (m, n // 2)
        assert rel_err(ours, ref) <= max(1.5 * rel_err(two_kernels, ref), 1e-3), m


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("n,k", SHAPES[:4])
def test_fp8_is_the_dequantized_product(n, k, gated):
    """Weight-only FP8 at 2-16 rows (the activations stay bf16): the dequantized product to
    bf16 rounding, not the few percent of per-token activation quantization."""
    gen = torch.Generator().manual_seed(n)
    with torch.device("cuda"):
        layer = Fp8Linear(k, n, bias=True)
    values, scale = quantize_rows(torch.randn(n, k, generator=gen).cuda() / k**0.5)
    layer.load_rows("weight", 0, n, values)
    layer.load_rows("weight_scale", 0, n, scale)
    layer.load_rows("bias", 0, n, torch.randn(n, generator=gen).cuda().to(torch.bfloat16))
    dense = dequantize_rows(values, scale, torch.float64)
    for m in ROWS:
        x = torch.randn(m, k, generator=gen).cuda().to(torch.bfloat16)
        assert small_m.uses_small_m(x, layer.weight)
        ref = F.linear(x.double(), dense, layer.bias.double())
        if gated:
            ref = F.silu(ref[:, : n // 2]) * ref[:, n // 2 :]
        out = layer.silu_and_mul(x) if gated else layer(x)
        assert out.dtype == torch.bfloat16 and out.shape == ref.shape
        assert rel_err(out, ref) < 1e-2, m


@pytest.mark.parametrize("fp8", [False, True])
def test_a_row_does_not_depend_on_the_rows_beside_it(fp8):
    """Row r of an m-row product is row r of the 16-row product, bit for bit: a batch padded
    to a captured size (5 verify rows in the graph of 8) computes its real rows unchanged."""
    torch.manual_seed(3)
    w = torch.randn(4096, 4096, device="cuda") * 0.02
    w, scale = quantize_rows(w) if fp8 else (w.to(torch.bfloat16), None)
    x = torch.randn(16, 4096, device="cuda").to(torch.bfloat16)
    full = small_m.small_m(x, w, scale=scale)
    for m in (2, 5, 8):
        assert torch.equal(small_m.small_m(x[:m], w, scale=scale), full[:m]), m


def test_one_compile_serves_every_row_count():
    """M is a runtime argument Triton does not specialize: the sizes a decode captures (2, 4,
    8, 16) and any between share one compiled kernel."""
    config = (64, 128, 2, 2)  # a tile no other test launches: its own cache entry
    w = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    small_m.small_m(torch.randn(3, 512, device="cuda", dtype=torch.bfloat16), w, config=config)
    cache = small_m._small_m_kernel.device_caches[torch.cuda.current_device()][0]
    before = len(cache)
    for m in (2, 4, 5, 8, 16):
        x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
        small_m.small_m(x, w, config=config)
    assert len(cache) == before


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("gated", [False, True])
def test_replays_in_a_cuda_graph_at_each_captured_size(gated, fp8):
    torch.manual_seed(4)
    n, k = 2 * 2048, 4096
    w = torch.randn(n, k, device="cuda") * 0.02
    if fp8:
        with torch.device("cuda"):
            layer = Fp8Linear(k, n, bias=False)
        layer.load_rows("weight", 0, n, w)
        product = layer.silu_and_mul if gated else layer
    else:
        w = w.to(torch.bfloat16)

        def product(x):
            return linear_silu_and_mul(x, w) if gated else linear(x, w)

    for m in (2, 4, 8, 16):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        product(x)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = product(x)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, product(x)), m


def test_an_8b_shaped_decode_takes_it_at_batch_2_to_16(tmp_path, monkeypatch):
    """The decode graphs of a Llama-3-8B-shaped model (one layer) at the captured sizes 2-16
    run every projection, the LM head included, through small_m; batch 1 through the GEMV."""
    from radixserve.model_executor.model_runner import ModelRunner
    from radixserve.model_loader.loader import load_model_source
    from radixserve.model_loader.random_init import PRESETS
    from radixserve.server_args import ServerArgs

    calls: list[tuple[int, tuple[int, ...], bool]] = []
    launch = small_m.small_m

    def spy(x, weight, *args, gated=False, **kwargs):
        calls.append((x.shape[0], tuple(weight.shape), gated))
        return launch(x, weight, *args, gated=gated, **kwargs)

    monkeypatch.setattr("radixserve.layers.linear.small_m", spy)
    model = random_model(tmp_path, "llama-8b-1", {**PRESETS["llama-3-8b"], "num_hidden_layers": 1})
    args = ServerArgs(
        model=model,
        device="cuda",
        dtype="bfloat16",
        attention_backend="triton",  # nothing to JIT-compile (FlashInfer builds at first use)
        mem_fraction_static=0.3,
        max_running_requests=16,
        cuda_graph_max_bs=16,
    )
    runner = ModelRunner(args, load_model_source(model, dtype="bfloat16", device="cuda"))
    assert runner.cuda_graph_runner is not None
    projections = {
        ((6144, 4096), False),
        ((4096, 4096), False),
        ((28672, 4096), True),
        ((4096, 14336), False),
        ((128256, 4096), False),
    }
    for bs in (2, 4, 8, 16):
        taken = {(shape, gated) for rows, shape, gated in calls if rows == bs}
        assert taken == projections, bs
    assert not any(rows == 1 for rows, _, _ in calls)
