"""MLA decode's absorbed projections at a few rows, per head, in Triton (DeepSeek V2/V3).

Decode folds W_UK into the query before the attention (q_latent = q_nope . W_UK[h]: 128 ->
512 values a head at V2/V3's sizes) and applies W_UV after it (512 -> 128): a batched matrix
product over heads whose weights (2 MB a layer at V2-Lite's 16 heads, 16 MB at V3's 128) are
what it reads. At one row cuBLAS runs each as a kernel of its own outside programmatic
dependent launch (PDL), which every other kernel of the step uses, so each waits for the
kernel before it to drain and the next one to launch. Here each is one PDL launch laid out as
the batch-1 GEMV (gemv.py): the weight stored output-major ([H, N, K], K contiguous), a
program per (head, a few output columns) over the whole of K, so that even V2-Lite's 2 MB
spreads over hundreds of programs. K fits one chunk (128 or 512 here), so a program's weight
slice, a constant, is read before its wait and streams under the previous kernel's tail.

(A first layout, [H, K, N] with 64 columns a program looping over K in chunks of 32, made 32
programs of W_UV at V2-Lite's size and took 11.8 us a launch: the step was 0.44 ms slower than
with cuBLAS, H200 2026-12-04.)
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
# The longest K a program reads whole (the weight slice loaded before the wait is one chunk)
MAX_K = 1024
# Weight elements a program streams: 4 KB of bf16, the batch-1 GEMV's size class
PROGRAM_ELEMENTS = 2048


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
    stride_wn,
    stride_om,
    stride_oh,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    """Out[m, h, cols] = W[h, cols, :] . X[m, h, :] for the M rows, in float32, rounded once."""
    blocks_n = tl.cdiv(N, BLOCK_N)
    head = (tl.program_id(0) // blocks_n).to(tl.int64)
    cols = (tl.program_id(0) % blocks_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = cols < N
    ks = tl.arange(0, BLOCK_K)
    k_mask = ks < K
    w = tl.load(
        W + head * stride_wh + cols.to(tl.int64)[:, None] * stride_wn + ks[None, :],
        mask=n_mask[:, None] & k_mask[None, :],
        other=0.0,
    )
    rows = tl.arange(0, BLOCK_M)
    m_mask = rows < M
    wait_for_prior_kernel(PDL)
    x = tl.load(
        X + rows.to(tl.int64)[:, None] * stride_xm + head * stride_xh + ks[None, :],
        mask=m_mask[:, None] & k_mask[None, :],
        other=0.0,
    )
    acc = tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    tl.store(
        Out + rows.to(tl.int64)[:, None] * stride_om + head * stride_oh + cols[None, :],
        acc.to(Out.dtype.element_ty),
        mask=m_mask[:, None] & n_mask[None, :],
    )


def block_n(k: int, n: int) -> int:
    """Output columns a program: PROGRAM_ELEMENTS of weight, at least one column."""
    return max(1, min(triton.next_power_of_2(n), PROGRAM_ELEMENTS // triton.next_power_of_2(k)))


def per_head_gemv(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None):
    """x [M, H, K] (any strides but a unit last one), weight [H, N, K] (output-major, unit-stride
    K) -> out [M, H, N] (made when not given; any strides but a unit last one): each head's
    rows times its own weight, `torch.bmm(x.transpose(0, 1), weight.transpose(1, 2))
    .transpose(0, 1)`, for M <= MAX_ROWS and K <= MAX_K."""
    rows, heads, k = x.shape
    n = weight.shape[1]
    if rows > MAX_ROWS or k > MAX_K:
        raise ValueError(
            f"the per-head GEMV takes at most {MAX_ROWS} rows of at most {MAX_K}, not {rows} of {k}"
        )
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("the per-head GEMV needs unit-stride rows")
    if out is None:
        out = torch.empty((rows, heads, n), dtype=x.dtype, device=x.device)
    if out.stride(-1) != 1:
        raise ValueError("the per-head GEMV writes unit-stride rows")
    columns = block_n(k, n)
    _per_head_gemv_kernel[(heads * triton.cdiv(n, columns),)](
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
        BLOCK_K=triton.next_power_of_2(k),
        BLOCK_N=columns,
        **dependent_launch(x),
    )
    return out
