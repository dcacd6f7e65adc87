"""The batch-1 GEMV on the GPU: every projection shape of the 1B and 8B Llama configurations
against a float32 reference (no worse than cuBLAS in the same dtype), `linear`'s dispatch, and
replay inside a CUDA graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixserve.kernels import fused_ops
from radixserve.kernels.gemv import gemv
from radixserve.kernels.skinny_gemm import MAX_ROWS
from radixserve.layers.linear import linear, linear_silu_and_mul
from radixserve.layers.quantization.fp8 import quantize_rows

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SHAPES = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048)]
SHAPES += [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (100, 4000)]


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", SHAPES)
def test_gemv_as_accurate_as_cublas(n, k, dtype):
    torch.manual_seed(n + k)
    w = (torch.randn(n, k, device="cuda") * 0.02).to(dtype)
    x = torch.randn(1, k, device="cuda").to(dtype)
    b = torch.randn(n, device="cuda").to(dtype)
    ref = F.linear(x.float(), w.float(), b.float())
    ours = linear(x, w, b)
    cublas = F.linear(x, w, b)
    assert ours.shape == (1, n) and ours.dtype == dtype
    # one rounding of a float32 sum: at most the half-precision output rounding, like cuBLAS
    assert rel_err(ours, ref) <= max(1.5 * rel_err(cublas, ref), 1e-3)


def test_linear_dispatch():
    w = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    one = torch.randn(1, 128, device="cuda", dtype=torch.bfloat16)
    few = torch.randn(3, 128, device="cuda", dtype=torch.bfloat16)
    many = torch.randn(MAX_ROWS + 1, 128, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(linear(one, w), gemv(one, w, None, 2, 1024, 4))
    # 2-16 rows: the skinny GEMM only where its device table names the shape (test_skinny_gemm.py)
    assert torch.equal(linear(few, w), F.linear(few, w))
    assert torch.equal(linear(many, w), F.linear(many, w))  # batches past it stay on cuBLAS
    w32, one32 = w.float(), one.float()
    assert torch.equal(linear(one32, w32), F.linear(one32, w32))  # float32 stays exact


@pytest.mark.parametrize(
    "product,n,k", [(linear, 4096, 4096), (linear_silu_and_mul, 2 * 8192, 2048)]
)
def test_gemv_replays_in_a_cuda_graph(product, n, k):
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    product(x, w)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = product(x, w)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, product(x, w))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_float32_logits_are_the_widened_product(dtype):
    """The LM head's float32 output holds exactly `.float()` of the half-precision GEMV."""
    w = (torch.randn(128256, 2048, device="cuda") * 0.02).to(dtype)
    x = torch.randn(1, 2048, device="cuda").to(dtype)
    wide = linear(x, w, out_dtype=torch.float32)
    assert wide.dtype == torch.float32
    assert torch.equal(wide, linear(x, w).float())
    many = torch.randn(3, 2048, device="cuda").to(dtype)  # cuBLAS, then widened
    assert torch.equal(linear(many, w, out_dtype=torch.float32), F.linear(many, w).float())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", [(16384, 2048), (28672, 4096), (2 * 1000, 300)])
def test_gated_gemv_is_the_product_then_the_activation(n, k, dtype):
    """silu(gate) * up from one launch: as accurate as the GEMV followed by the activation
    kernel (which rounds the same products and computes the same float32 formula)."""
    torch.manual_seed(n + k)
    w = (torch.randn(n, k, device="cuda") * 0.02).to(dtype)
    x = torch.randn(1, k, device="cuda").to(dtype)
    b = (torch.randn(n, device="cuda") * 0.1).to(dtype)
    ref = F.linear(x.float(), w.float(), b.float())
    ref = F.silu(ref[:, : n // 2]) * ref[:, n // 2 :]
    ours = linear_silu_and_mul(x, w, b)
    two_kernels = fused_ops.silu_and_mul(linear(x, w, b))
    assert ours.shape == (1, n // 2) and ours.dtype == dtype
    assert rel_err(ours, ref) <= max(1.5 * rel_err(two_kernels, ref), 1e-3)
    many = torch.randn(3, k, device="cuda").to(dtype)  # batches: cuBLAS, then the activation
    assert torch.equal(
        linear_silu_and_mul(many, w, b), fused_ops.silu_and_mul(F.linear(many, w, b))
    )


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("k", [4096, 4000])
def test_a_pipelined_loop_sums_what_the_plain_loop_sums(fp8, gated, k):
    """Stages change when a chunk is loaded, not what is added in which order: the same tile's
    results are bit-identical at every depth, K's masked tail included (4000 is no multiple of
    the chunk)."""
    torch.manual_seed(k)
    w = torch.randn(2048, k, device="cuda") * 0.02
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    w, scale = quantize_rows(w) if fp8 else (w.to(torch.bfloat16), None)
    for rows, chunk, warps in ((8, 1024, 2), (4, 512, 1), (8, 512, 2)):
        plain = gemv(x, w, None, rows, chunk, warps, 1, gated=gated, scale=scale)
        for stages in (2, 3, 4):
            pipelined = gemv(x, w, None, rows, chunk, warps, stages, gated=gated, scale=scale)
            assert torch.equal(pipelined, plain), (rows, chunk, warps, stages)
