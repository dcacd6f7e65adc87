"""The skinny GEMM (2-16 rows) on the GPU: the 1B and 8B Llama projection shapes against a
float32 reference (no worse than cuBLAS in the same dtype), plain and gated, every row count;
rows independent of each other (a verify step's rows must not change with the batch's other
rows); replay inside a CUDA graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixserve.kernels import fused_ops
from radixserve.kernels.skinny_gemm import MAX_ROWS, skinny_gemm
from radixserve.layers.linear import linear, linear_silu_and_mul

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SHAPES = [(3072, 2048), (2048, 8192), (128256, 2048)]
SHAPES += [(6144, 4096), (4096, 4096), (4096, 14336), (100, 4000)]


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("rows", [2, 5, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", SHAPES)
def test_skinny_gemm_as_accurate_as_cublas(n, k, dtype, rows):
    torch.manual_seed(n + k + rows)
    w = (torch.randn(n, k, device="cuda") * 0.02).to(dtype)
    x = torch.randn(rows, k, device="cuda").to(dtype)
    b = torch.randn(n, device="cuda").to(dtype)
    ref = F.linear(x.float(), w.float(), b.float())
    ours = linear(x, w, b)
    cublas = F.linear(x, w, b)
    assert ours.shape == (rows, n) and ours.dtype == dtype
    assert rel_err(ours, ref) <= max(1.5 * rel_err(cublas, ref), 1e-3)


@pytest.mark.parametrize("rows", [2, 5, 16])
@pytest.mark.parametrize("n,k", [(2 * 14336, 4096), (2 * 8192, 2048)])
def test_gated_skinny_gemm_is_the_product_then_the_activation(n, k, rows):
    torch.manual_seed(rows)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    fused = linear_silu_and_mul(x, w)
    assert fused.shape == (rows, n // 2)
    assert torch.equal(fused, fused_ops.silu_and_mul(skinny_gemm(x, w)))
    ref = F.linear(x.float(), w.float())
    ref = F.silu(ref[:, : n // 2]) * ref[:, n // 2 :]
    assert rel_err(fused, ref) < 1e-2


def test_each_row_is_independent_of_the_others():
    torch.manual_seed(3)
    w = torch.randn(6144, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(MAX_ROWS, 4096, device="cuda", dtype=torch.bfloat16)
    whole = skinny_gemm(x, w)
    for rows in (2, 5, 9):
        assert torch.equal(skinny_gemm(x[:rows], w), whole[:rows])
    assert torch.equal(skinny_gemm(x[[4, 4]], w)[0], whole[4])


@pytest.mark.parametrize("product,n,k", [(linear, 4096, 4096), (linear_silu_and_mul, 28672, 4096)])
def test_skinny_gemm_replays_in_a_cuda_graph(product, n, k):
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(5, k, device="cuda", dtype=torch.bfloat16)
    product(x, w)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = product(x, w)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, product(x, w))
