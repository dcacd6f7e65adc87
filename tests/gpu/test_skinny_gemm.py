"""The skinny GEMM (2-16 rows) on the GPU: the 1B and 8B Llama projection shapes against a
float32 reference (no worse than cuBLAS in the same dtype), plain and gated, every row count,
with the default tile and with every tile `SKINNY_TILES` names; rows independent of each other
(a verify step's rows must not change with the batch's other rows); `linear` taking it exactly
where the device's table names the shape; replay inside a CUDA graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixserve.kernels import fused_ops
from radixserve.kernels import skinny_gemm as skinny_module
from radixserve.kernels.gemv import block_config, gemv
from radixserve.kernels.skinny_gemm import MAX_ROWS, SKINNY_TILES, skinny_gemm
from radixserve.layers.linear import linear, linear_silu_and_mul

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# a tile every shape here fits (the H100's for the 8B q/k/v); `SKINNY_TILES`' own are tested too
TILE = (64, 128, 4, 4)
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
    ours = skinny_gemm(x, w, b, TILE)
    cublas = F.linear(x, w, b)
    assert ours.shape == (rows, n) and ours.dtype == dtype
    assert rel_err(ours, ref) <= max(1.5 * rel_err(cublas, ref), 1e-3)


TABLED = sorted({(shape, tile) for tiles in SKINNY_TILES.values() for shape, tile in tiles.items()})


@pytest.mark.parametrize("rows", [2, 5, 16])
@pytest.mark.parametrize("shape,tile", TABLED)
def test_every_tabled_tile_as_accurate_as_cublas(shape, tile, rows):
    n, k, gated = shape
    torch.manual_seed(n + k + rows)
    w = torch.randn((1 + gated) * n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    ref = F.linear(x.float(), w.float())
    cublas = F.linear(x, w)
    if gated:
        ref = F.silu(ref[:, :n]) * ref[:, n:]
        cublas = fused_ops.silu_and_mul(cublas)
    ours = skinny_gemm(x, w, None, tile, gated=gated)
    assert ours.shape == (rows, n)
    assert rel_err(ours, ref) <= max(1.5 * rel_err(cublas, ref), 1e-3)


def test_linear_takes_it_exactly_where_the_device_table_names_the_shape(monkeypatch):
    tile, gated_tile = (64, 128, 4, 4), (32, 128, 4, 3)
    table = {(4096, 4096, False): tile, (14336, 4096, True): gated_tile}
    monkeypatch.setattr(skinny_module, "_device_tiles", lambda index: table)
    torch.manual_seed(5)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    w_gate_up = torch.randn(28672, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    w_other = torch.randn(6144, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(5, 4096, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(linear(x, w), skinny_gemm(x, w, None, tile))
    logits = linear(x, w, out_dtype=torch.float32)
    assert logits.dtype == torch.float32 and torch.equal(logits, linear(x, w).float())
    fused = linear_silu_and_mul(x, w_gate_up)
    assert torch.equal(fused, skinny_gemm(x, w_gate_up, None, gated_tile, gated=True))
    assert torch.equal(linear(x, w_other), F.linear(x, w_other))  # not in the table: cuBLAS
    one = linear(x[:1], w)  # one row: the GEMV, before the table is asked
    assert torch.equal(one, gemv(x[:1], w, None, *block_config(*w.shape)))


@pytest.mark.parametrize("rows", [2, 5, 16])
@pytest.mark.parametrize("n,k", [(2 * 14336, 4096), (2 * 8192, 2048)])
def test_gated_skinny_gemm_is_the_product_then_the_activation(n, k, rows):
    torch.manual_seed(rows)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    fused = skinny_gemm(x, w, None, TILE, gated=True)
    assert fused.shape == (rows, n // 2)
    assert torch.equal(fused, fused_ops.silu_and_mul(skinny_gemm(x, w, None, TILE)))
    ref = F.linear(x.float(), w.float())
    ref = F.silu(ref[:, : n // 2]) * ref[:, n // 2 :]
    assert rel_err(fused, ref) < 1e-2


def test_each_row_is_independent_of_the_others():
    torch.manual_seed(3)
    w = torch.randn(6144, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(MAX_ROWS, 4096, device="cuda", dtype=torch.bfloat16)
    whole = skinny_gemm(x, w, None, TILE)
    for rows in (2, 5, 9):
        assert torch.equal(skinny_gemm(x[:rows], w, None, TILE), whole[:rows])
    assert torch.equal(skinny_gemm(x[[4, 4]], w, None, TILE)[0], whole[4])


@pytest.mark.parametrize("gated,n,k", [(False, 4096, 4096), (True, 28672, 4096)])
def test_skinny_gemm_replays_in_a_cuda_graph(gated, n, k):
    def product(x, w):
        return skinny_gemm(x, w, None, TILE, gated=gated)

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
