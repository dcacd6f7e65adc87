"""FP8 (e4m3) quantization of rows: a weight's rows at load (torch), and a batch's activations
per token before an FP8 x FP8 product (one Triton launch on CUDA)."""

from __future__ import annotations

import torch

from radixserve.kernels import triton_support
from radixserve.kernels.triton_support import jit, tl, triton

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max
# a row of zeros still gets a usable (tiny, positive) scale
_MIN_SCALE = 1e-12
_QUANT_BLOCK_K = 4096


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] -> (float8 values, float32 scale per row [...]): each row scaled so that its
    largest magnitude maps to the format's largest finite value."""
    w = weight.float()
    scale = (w.abs().amax(dim=-1) / FP8_MAX).clamp(min=_MIN_SCALE)
    values = (w / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return values, scale


@jit
def _per_token_quant_kernel(X, Q, S, K, stride_x, stride_q, BLOCK_K: tl.constexpr):
    """One row: its largest magnitude, then the row / (amax / 448) as FP8 and that scale."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    amax = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(X + row * stride_x + k0 + cols, mask=k0 + cols < K, other=0.0)
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    scale = tl.maximum(tl.max(amax, 0) / 448.0, 1e-12)
    for k0 in range(0, K, BLOCK_K):
        mask = k0 + cols < K
        x = tl.load(X + row * stride_x + k0 + cols, mask=mask, other=0.0).to(tl.float32)
        q = tl.clamp(x / scale, -448.0, 448.0)
        tl.store(Q + row * stride_q + k0 + cols, q.to(Q.dtype.element_ty), mask=mask)
    tl.store(S + row, scale)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] activations -> (FP8 [M, K], float32 scales [M, 1]), one scale per row, in one
    launch on CUDA (the torch ops below elsewhere)."""
    if not triton_support.enabled_for(x):
        q, scale = quantize_rows(x)
        return q, scale[:, None]
    m, k = x.shape
    q = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        block_k = min(_QUANT_BLOCK_K, triton.next_power_of_2(k))
        _per_token_quant_kernel[(m,)](
            x, q, scale, k, x.stride(0), q.stride(0), BLOCK_K=block_k, num_warps=4
        )
    return q, scale
