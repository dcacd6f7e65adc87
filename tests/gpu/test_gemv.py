"""The batch-1 GEMV on the GPU: every projection shape of the 1B and 8B Llama configurations
against a float32 reference (no worse than cuBLAS in the same dtype), `linear`'s dispatch, and
replay inside a CUDA graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixserve.layers.gemv import gemv, linear

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
    many = torch.randn(3, 128, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(linear(one, w), gemv(one, w, None, 2, 1024, 4))
    assert torch.equal(linear(many, w), F.linear(many, w))  # batches stay on cuBLAS
    w32, one32 = w.float(), one.float()
    assert torch.equal(linear(one32, w32), F.linear(one32, w32))  # float32 stays exact


def test_gemv_replays_in_a_cuda_graph():
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    linear(x, w)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = linear(x, w)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, linear(x, w))


# (hidden, qkv rows, gate/up rows, intermediate): the 1B and 8B layers
LAYERS = [(2048, 3072, 16384, 8192), (4096, 6144, 28672, 14336)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hidden,qkv,gate_up,inter", LAYERS)
def test_folded_prologues_match_the_kernels_they_replace(hidden, qkv, gate_up, inter, dtype):
    """A layer's norms and SiLU-and-mul inside the GEMV against the standalone fused kernels
    followed by the plain GEMV: the same products of inputs rounded at the same points (the
    norm's sum of squares may be reduced in another order: at most an ulp of an input)."""
    from radixserve.layers import fused_ops
    from radixserve.layers.activation import SiluAndMul
    from radixserve.layers.gemv import Linear
    from radixserve.layers.layernorm import RMSNorm

    torch.manual_seed(hidden)
    norm = RMSNorm(hidden, eps=1e-5).to("cuda", dtype)
    norm.weight.data = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(dtype)
    proj = Linear(hidden, qkv, bias=False).to("cuda", dtype)
    down = Linear(inter, hidden, bias=False).to("cuda", dtype)
    x = torch.randn(1, hidden, device="cuda").to(dtype)
    res = torch.randn(1, hidden, device="cuda").to(dtype)
    act = torch.randn(1, 2 * inter, device="cuda").to(dtype)

    y, summed = proj.after_norm(norm, x, res)
    ref_x, ref_res = fused_ops.fused_add_rms_norm(x.clone(), res.clone(), norm.weight, 1e-5)
    assert torch.equal(summed, ref_res) and summed.data_ptr() != res.data_ptr()
    exact = F.linear(ref_x.float(), proj.weight.float())
    assert rel_err(y, exact) <= max(1.5 * rel_err(F.linear(ref_x, proj.weight), exact), 1e-3)
    assert rel_err(y, gemv(ref_x, proj.weight, None, 2, 1024, 4).float()) <= 2e-3

    y, same = proj.after_norm(norm, x, None)
    assert same is x
    ref_x = fused_ops.rms_norm(x, norm.weight, 1e-5)
    assert rel_err(y, gemv(ref_x, proj.weight, None, 2, 1024, 4).float()) <= 2e-3

    y = down.after_silu_and_mul(act, SiluAndMul())
    plain = down(fused_ops.silu_and_mul(act))
    assert torch.equal(y, plain)  # identical inputs, identical blocks: bit for bit


def test_folded_prologues_replay_in_a_cuda_graph():
    from radixserve.layers.activation import SiluAndMul
    from radixserve.layers.gemv import Linear
    from radixserve.layers.layernorm import RMSNorm

    dtype = torch.bfloat16
    norm = RMSNorm(2048, eps=1e-5).to("cuda", dtype)
    proj, down = Linear(2048, 3072).to("cuda", dtype), Linear(8192, 2048).to("cuda", dtype)
    x, res = (torch.randn(1, 2048, device="cuda", dtype=dtype) for _ in range(2))
    act = torch.randn(1, 16384, device="cuda", dtype=dtype)

    def step():
        y, summed = proj.after_norm(norm, x, res)
        return y, summed, down.after_silu_and_mul(act, SiluAndMul())

    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    for t in (x, res, act):
        t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(outs, step(), strict=True):
        assert torch.equal(got, want)
