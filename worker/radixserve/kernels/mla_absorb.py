"""MLA decode's absorbed projections at a few rows, per head, in Triton (DeepSeek V2/V3).

Decode folds W_UK into the query before the attention (q_latent = q_nope . W_UK[h]: 128 ->
512 values a head at V2/V3's sizes) and applies W_UV after it (512 -> 128): a batched matrix
product over heads whose weights (2 MB a layer at V2-Lite's 16 heads, 16 MB at V3's 128) are
what it reads. At one row cuBLAS runs each as a kernel of its own outside programmatic
dependent launch (PDL), which every other kernel of the step uses, so each waits for the
kernel before it to drain and the next one to launch: here each is one PDL launch, a program
per (head, block of output columns) streaming its slice of that head's weight against the
row(s), as the batch-1 GEMV (gemv.py) streams a projection.
"""

from __future__ import annotations

import torch

from radixserve.kernels.triton_support import (
    dependent_launch,
    jit,
    tl,
    triton,
    wait_for_prior_kernel,
)

# Rows up to which the MLA layer takes this kernel (decode batches of 1-4); past them the rows
# are enough for cuBLAS's batched GEMM to reuse each weight tile.
MAX_ROWS = 4
# Output columns a program and the K chunk: at V2-Lite's 16 heads W_UK's 512 columns make 128
# programs of 16 KB, W_UV's 128 columns 64 programs of 32 KB; a [rows, K chunk, columns]
# float32 product stays within 64 registers a thread on 4 warps at 4 rows.
BLOCK_N = 64
BLOCK_K = 32


@jit
def _per_head_gemv_kernel(
    X,
    W,
    Out,
    M,
    K,
    N,
    stride_xm,
    stride_xh,
    stride_wh,
    stride_wk,
    stride_om,
    stride_oh,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    """Out[m, h, cols] = X[m, h, :] . W[h, :, cols] for the M rows, in float32, rounded once."""
    head = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = cols < N
    rows = tl.arange(0, BLOCK_M)
    m_mask = rows < M
    x_rows = X + rows.to(tl.int64)[:, None] * stride_xm + head * stride_xh
    w_head = W + head * stride_wh + cols[None, :]
    wait_for_prior_kernel(PDL)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < K
        w = tl.load(
            w_head + ks.to(tl.int64)[:, None] * stride_wk,
            mask=k_mask[:, None] & n_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        x = tl.load(x_rows + ks[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        acc += tl.sum(x.to(tl.float32)[:, :, None] * w[None, :, :], axis=1)
    tl.store(
        Out + rows.to(tl.int64)[:, None] * stride_om + head * stride_oh + cols[None, :],
        acc.to(Out.dtype.element_ty),
        mask=m_mask[:, None] & n_mask[None, :],
    )


def per_head_gemv(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None):
    """x [M, H, K] (any strides but a unit last one), weight [H, K, N] -> out [M, H, N] (made
    when not given; any strides but a unit last one): each head's rows times its own weight, as
    `torch.bmm(x.transpose(0, 1), weight).transpose(0, 1)` computes it, for M <= MAX_ROWS."""
    rows, heads, k = x.shape
    n = weight.shape[2]
    if rows > MAX_ROWS:
        raise ValueError(f"the per-head GEMV takes at most {MAX_ROWS} rows, not {rows}")
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("the per-head GEMV needs unit-stride rows")
    if out is None:
        out = torch.empty((rows, heads, n), dtype=x.dtype, device=x.device)
    if out.stride(-1) != 1:
        raise ValueError("the per-head GEMV writes unit-stride rows")
    _per_head_gemv_kernel[(heads, triton.cdiv(n, BLOCK_N))](
        x,
        weight,
        out,
        rows,
        k,
        n,
        x.stride(0),
        x.stride(1),
        weight.stride(0),
        weight.stride(1),
        out.stride(0),
        out.stride(1),
        BLOCK_M=triton.next_power_of_2(max(rows, 1)),
        BLOCK_K=BLOCK_K,
        BLOCK_N=BLOCK_N,
        **dependent_launch(x),
    )
    return out
