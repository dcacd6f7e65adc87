"""LoRA's two batched products, segmented by adapter (Punica's SGMV, S-LoRA's MBGMM): `shrink`
(x · Aᵀ, hidden -> rank) and `expand` (y += s · Bᵀ, rank -> output), for a batch whose rows use
different adapters, in one launch each whatever the mix.

A batch is cut into segments of consecutive tokens that share one adapter slot: a request's
extend tokens, or one decode row. A program takes a block of one segment's tokens and the
slot's A or B, so a prefill reads each adapter's weights once per token block, not once per
token; a decode row is a one-token segment (the step is bound by reading the weights anyway).
Slot -1 is the base model: its programs load nothing and add nothing.

The adapters' weights are stacked by slot: A `[slots, n_sub * R, K]` (the sub-projections of a
fused projection, q/k/v or gate/up, one after the other, each padded to the pool's rank R) and
B `[slots, N, R]`. `expand` adds one sub-projection's output columns; a fused projection calls
it once per sub-projection (a fixed count, never per adapter).

The torch functions are the CPU path and the kernels' reference: they compute every slot's
product and keep each token's own, which costs `slots` times the work but has no Python loop
over adapters either.
"""

from __future__ import annotations

import torch

from radixserve.kernels import triton_support
from radixserve.kernels.triton_support import jit, tl, triton

_BLOCK_M = 16  # tokens per program (tl.dot's smallest tile)


@jit
def _shrink_kernel(
    X,
    A,
    Out,
    SegStart,
    SegSlot,
    K,
    R_total,
    stride_xm,
    stride_as,
    stride_ar,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seg = tl.program_id(0)
    block = tl.program_id(1)
    rblock = tl.program_id(2)
    slot = tl.load(SegSlot + seg).to(tl.int64)
    start = tl.load(SegStart + seg)
    end = tl.load(SegStart + seg + 1)
    rows = start + block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < end
    cols = rblock * BLOCK_R + tl.arange(0, BLOCK_R)
    col_ok = cols < R_total
    # a base-model segment (slot -1) loads nothing: its rows and columns are all masked off
    live_rows = rows < tl.where(slot >= 0, end, start)
    live_cols = cols < tl.where(slot >= 0, R_total, 0)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(
            X + rows[:, None].to(tl.int64) * stride_xm + ks[None, :],
            mask=live_rows[:, None] & k_ok[None, :],
            other=0.0,
        )
        a = tl.load(
            A + slot * stride_as + cols[None, :].to(tl.int64) * stride_ar + ks[:, None],
            mask=live_cols[None, :] & k_ok[:, None],
            other=0.0,
        )
        acc += tl.dot(x, a, input_precision=PRECISION)
    tl.store(
        Out + rows[:, None].to(tl.int64) * stride_om + cols[None, :],
        acc,
        mask=row_ok[:, None] & col_ok[None, :],
    )


@jit
def _expand_kernel(
    S,
    B,
    Y,
    SegStart,
    SegSlot,
    N,
    R,
    stride_sm,
    stride_bs,
    stride_bn,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seg = tl.program_id(0)
    block = tl.program_id(1)
    nblock = tl.program_id(2)
    slot = tl.load(SegSlot + seg).to(tl.int64)
    start = tl.load(SegStart + seg)
    end = tl.load(SegStart + seg + 1)
    rows = start + block * BLOCK_M + tl.arange(0, BLOCK_M)
    # a base-model segment (slot -1) reads and writes nothing
    row_ok = rows < tl.where(slot >= 0, end, start)
    ns = nblock * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = ns < tl.where(slot >= 0, N, 0)
    rs = tl.arange(0, BLOCK_R)
    r_ok = rs < R
    s = tl.load(
        S + rows[:, None].to(tl.int64) * stride_sm + rs[None, :],
        mask=row_ok[:, None] & r_ok[None, :],
        other=0.0,
    )
    b = tl.load(
        B + slot * stride_bs + ns[None, :].to(tl.int64) * stride_bn + rs[:, None],
        mask=n_ok[None, :] & r_ok[:, None],
        other=0.0,
    )
    delta = tl.dot(s.to(b.dtype), b, input_precision=PRECISION)
    out = Y + rows[:, None].to(tl.int64) * stride_ym + ns[None, :]
    mask = row_ok[:, None] & n_ok[None, :]
    y = tl.load(out, mask=mask, other=0.0)
    tl.store(out, (y.to(tl.float32) + delta).to(y.dtype), mask=mask)


def shrink(
    x: torch.Tensor,
    a: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_slots: torch.Tensor,
    max_seg_len: int,
    token_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """x `[T, K]` times each token's slot's A `[slots, R_total, K]`: float32 `[T, R_total]`,
    zeros for base tokens (slot -1). `seg_starts` `[segments + 1]` and `seg_slots`
    `[segments]` (int32, on x's device) cut the tokens into runs of one slot; `token_slots`
    `[T]` is the same per token, which the torch path uses instead."""
    if triton_support.enabled_for(x):
        return _shrink_triton(x, a, seg_starts, seg_slots, max_seg_len)
    assert token_slots is not None
    return shrink_torch(x, a, token_slots)


def expand(
    y: torch.Tensor,
    s: torch.Tensor,
    b: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_slots: torch.Tensor,
    max_seg_len: int,
    token_slots: torch.Tensor | None = None,
) -> None:
    """y `[T, N]` += s `[T, R]` times each token's slot's B `[slots, N, R]`, in place (y may be
    a column slice of a fused projection's output)."""
    if triton_support.enabled_for(y):
        _expand_triton(y, s, b, seg_starts, seg_slots, max_seg_len)
        return
    assert token_slots is not None
    expand_torch(y, s, b, token_slots)


def _shrink_triton(
    x: torch.Tensor,
    a: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_slots: torch.Tensor,
    max_seg_len: int,
) -> torch.Tensor:
    tokens, k = x.shape
    r_total = a.shape[1]
    out = torch.empty((tokens, r_total), dtype=torch.float32, device=x.device)
    segments = seg_slots.shape[0]
    if tokens == 0 or segments == 0:
        return out.zero_()
    block_r = max(16, min(64, triton.next_power_of_2(r_total)))
    grid = (segments, triton.cdiv(max_seg_len, _BLOCK_M), triton.cdiv(r_total, block_r))
    _shrink_kernel[grid](
        x,
        a,
        out,
        seg_starts,
        seg_slots,
        k,
        r_total,
        x.stride(0),
        a.stride(0),
        a.stride(1),
        out.stride(0),
        BLOCK_M=_BLOCK_M,
        BLOCK_R=block_r,
        BLOCK_K=64,
        PRECISION=triton_support.dot_precision(x.dtype),
    )
    return out


def _expand_triton(
    y: torch.Tensor,
    s: torch.Tensor,
    b: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_slots: torch.Tensor,
    max_seg_len: int,
) -> None:
    tokens, n = y.shape
    rank = b.shape[2]
    segments = seg_slots.shape[0]
    if tokens == 0 or segments == 0:
        return
    block_n = 64
    grid = (segments, triton.cdiv(max_seg_len, _BLOCK_M), triton.cdiv(n, block_n))
    _expand_kernel[grid](
        s,
        b,
        y,
        seg_starts,
        seg_slots,
        n,
        rank,
        s.stride(0),
        b.stride(0),
        b.stride(1),
        y.stride(0),
        BLOCK_M=_BLOCK_M,
        BLOCK_N=block_n,
        BLOCK_R=max(16, triton.next_power_of_2(rank)),
        PRECISION=triton_support.dot_precision(y.dtype),
    )


def shrink_torch(x: torch.Tensor, a: torch.Tensor, token_slots: torch.Tensor) -> torch.Tensor:
    """The torch path of `shrink`: every slot's product, each token keeping its own."""
    slots, r_total, _ = a.shape
    every = (x @ a.reshape(slots * r_total, -1).t()).view(-1, slots, r_total)
    rows = torch.arange(x.shape[0], device=x.device)
    mine = every[rows, token_slots.clamp(min=0).long()]
    return (mine * (token_slots >= 0).unsqueeze(1)).float()


def expand_torch(
    y: torch.Tensor, s: torch.Tensor, b: torch.Tensor, token_slots: torch.Tensor
) -> None:
    """The torch path of `expand`: s placed in its token's slot's columns (zeros elsewhere),
    times every slot's B at once."""
    slots, n, rank = b.shape
    placed = torch.zeros((s.shape[0], slots, rank), dtype=b.dtype, device=s.device)
    rows = torch.arange(s.shape[0], device=s.device)
    used = token_slots >= 0
    placed[rows[used], token_slots[used].long()] = s[used].to(b.dtype)
    y += (placed.reshape(-1, slots * rank) @ b.permute(0, 2, 1).reshape(slots * rank, n)).to(
        y.dtype
    )
