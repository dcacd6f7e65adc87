"""Batch-1 projections as a Triton matrix-vector product, and `linear`, which picks it.

At batch 1 a projection reads its whole weight to produce one row: it is a pure stream of the
weight, and the time is bytes / bandwidth. On the H200 cuBLAS reaches 40-75% of the bandwidth
on the small matrices of a decode step (scripts/gpu/bench_gemv.py, 2026-11-29: 1B o_proj
2048x2048 5.2 us against a 2.0 us floor, 8B o_proj 10.8 us against 7.9 us); this GEMV, two
rows per program so that the whole GPU streams even the smallest matrix, took 3.0 and 6.3 us
and beat cuBLAS on every projection of the 1B and 8B shapes, LM heads included.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.layers import fused_ops

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: never launched
    triton = None


def _jit(fn: Callable) -> Callable:
    return triton.jit(fn) if triton is not None else fn


# What the GEMV computes from its input vector before the product (a constexpr of the kernel).
_PLAIN = 0  # x as it is
_NORM = 1  # rms_norm(x) * norm_weight
_ADD_NORM = 2  # rms_norm(x + residual) * norm_weight; x + residual is also written out
_SILU_MUL = 3  # silu(x[:K]) * x[K:], x being a fused gate/up row of 2K


@_jit
def _gemv_kernel(
    X,
    W,
    Bias,
    Y,
    N,
    K,
    stride_wn,
    Residual,
    NormW,
    ResidualOut,
    eps,
    HAS_BIAS: tl.constexpr,
    PROLOGUE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """y[BLOCK_N rows] = W[rows] . f(x): products accumulate elementwise in float32 across the
    K loop and are reduced once at the end.

    f is the PROLOGUE: the element-wise op that would otherwise be a kernel of its own before
    this one (a decoder layer's RMSNorm, its SiLU-and-mul). Every program recomputes it from
    the input vector, a few KB read from L2, which costs less than a launch and a round trip
    through memory. The rounding is the standalone kernels' (fused_ops.py): f's result is
    rounded to the activation dtype exactly where theirs is stored."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rows < N
    w_rows = W + rows.to(tl.int64)[:, None] * stride_wn
    dtype = X.dtype.element_ty
    inv_rms = 1.0
    if PROLOGUE == 1 or PROLOGUE == 2:
        squares = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            mask_k = ks < K
            h = tl.load(X + ks, mask=mask_k, other=0.0)
            if PROLOGUE == 2:
                # the sum is rounded to the activation dtype before the norm; program 0 keeps it
                h = (h.to(tl.float32) + tl.load(Residual + ks, mask=mask_k, other=0.0)).to(dtype)
                tl.store(ResidualOut + ks, h, mask=mask_k & (pid == 0))
            h = h.to(tl.float32)
            squares += h * h
        inv_rms = tl.rsqrt(tl.sum(squares, axis=0) / K + eps)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        mask_k = ks < K
        if PROLOGUE == 3:
            gate = tl.load(X + ks, mask=mask_k, other=0.0).to(tl.float32)
            up = tl.load(X + K + ks, mask=mask_k, other=0.0).to(tl.float32)
            x = (gate / (1.0 + tl.exp(-gate)) * up).to(dtype).to(tl.float32)
        else:
            x = tl.load(X + ks, mask=mask_k, other=0.0)
            if PROLOGUE == 2:
                x = (x.to(tl.float32) + tl.load(Residual + ks, mask=mask_k, other=0.0)).to(dtype)
            x = x.to(tl.float32)
            if PROLOGUE == 1 or PROLOGUE == 2:
                norm_w = tl.load(NormW + ks, mask=mask_k, other=0.0).to(tl.float32)
                x = ((x * inv_rms).to(dtype).to(tl.float32) * norm_w).to(dtype).to(tl.float32)
        w = tl.load(w_rows + ks[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(Bias + rows, mask=mask_n, other=0.0).to(tl.float32)
    tl.store(Y + rows, y.to(Y.dtype.element_ty), mask=mask_n)


def _block_config(n: int, k: int) -> tuple[int, int, int]:
    """(rows per program, K chunk, warps): the fastest of bench_gemv.py's sweep per shape
    class on the H200. Large matrices want long chunks and few warps; small ones more
    warps per row."""
    if n * k >= 32 << 20:  # gate/up, down (8B), LM heads
        return 2, 2048, 2
    if k >= 4096 and n >= 4096:  # 8B qkv and o
        return 2, 512, 2
    return 2, 1024, 4  # 1B qkv, o, down


def _gemv_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether x @ weight.T takes the GEMV: one half-precision row on a CUDA device, where the
    fused kernels are on (tests turn them off through `fused_ops.enabled_for` to get the torch
    path). float32 stays on cuBLAS: it is the exactness reference, and not where speed is
    measured."""
    return (
        fused_ops.enabled_for(x)
        and x.dim() == 2
        and x.shape[0] == 1
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
        and weight.stride(1) == 1
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through the GEMV when x is one half-precision row on a CUDA device."""
    if _gemv_fits(x, weight):
        return gemv(x, weight, bias, *_block_config(*weight.shape))
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear (same parameters, same checkpoint names) whose batch-1 products on CUDA run
    the GEMV, with the element-wise op before it folded in where the model asks for it.

    A batch-1 decode step of a small model is bound by kernel count, not bytes: the 1B shape's
    16 layers ran ~10 kernels each, and the two RMSNorms and the SiLU-and-mul are whole
    launches for 4-16 KB of work. Folded into the projections that consume them, they cost
    the GEMV's programs a re-read of the input vector from L2."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

    def after_norm(
        self, norm: nn.Module, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(self(norm(x + residual)), x + residual), or with no residual
        (self(norm(x)), x): the decoder layer's norm and the projection after it.

        `norm` is an RMSNorm (layernorm.py), whose own call runs when the GEMV does not."""
        if not _gemv_fits(x, self.weight) or (
            residual is not None and not residual.is_contiguous()
        ):
            if residual is None:
                return self(norm(x)), x
            x, residual = norm(x, residual)
            return self(x), residual
        summed = x if residual is None else torch.empty_like(x)
        y = _launch(
            x,
            self.weight,
            self.bias,
            _NORM if residual is None else _ADD_NORM,
            residual=residual,
            norm_weight=norm.weight,
            residual_out=summed,
            eps=norm.variance_epsilon,
        )
        return y, summed

    def after_silu_and_mul(self, gate_up: torch.Tensor, act: nn.Module) -> torch.Tensor:
        """self(silu(gate) * up) for a fused [.., 2K] gate/up row; `act` (SiluAndMul) runs on
        its own when the GEMV does not."""
        k = gate_up.shape[-1] // 2
        if not _gemv_fits(gate_up, self.weight) or not gate_up.is_contiguous():
            return self(act(gate_up))
        return _launch(gate_up, self.weight, self.bias, _SILU_MUL, k=k)


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    block_n: int = 4,
    block_k: int = 512,
    num_warps: int = 4,
) -> torch.Tensor:
    """F.linear(x, weight, bias) for x of one row ([1, K] or [K]); weight [N, K] unit-stride rows."""
    return _launch(x, weight, bias, _PLAIN, config=(block_n, block_k, num_warps))


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    prologue: int,
    *,
    k: int | None = None,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
    eps: float = 0.0,
    config: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """One GEMV launch; `k` is the product's length where it is not x's (SiLU-and-mul halves it)."""
    k = x.shape[-1] if k is None else k
    n = weight.shape[0]
    if x.numel() != x.shape[-1] or weight.shape[1] != k or weight.stride(1) != 1:
        raise ValueError(f"gemv needs one row x and [N, K] weight, got {x.shape}, {weight.shape}")
    block_n, block_k, num_warps = config or _block_config(n, k)
    y = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x.contiguous(),
        weight,
        bias if bias is not None else weight,
        y,
        n,
        k,
        weight.stride(0),
        residual if residual is not None else x,
        norm_weight if norm_weight is not None else weight,
        residual_out if residual_out is not None else y,
        eps,
        HAS_BIAS=bias is not None,
        PROLOGUE=prologue,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=num_warps,
    )
    return y
