"""LoRA's two batched products, segmented by adapter (Punica's SGMV, S-LoRA's MBGMM): `shrink`
(x · Aᵀ, hidden -> rank) and `expand` (y += s · Bᵀ, rank -> output), for a batch whose rows use
different adapters, in one launch each whatever the mix.

A batch is cut into segments of consecutive tokens that share one adapter slot: a request's
extend tokens, or one decode row. With longer segments a program takes a block of one
segment's tokens and the slot's A or B, so a prefill reads each adapter's weights once per
token block, not once per token. A decode pass (one-row segments) goes by slot instead: a
program per slot takes a block of up to 64 rows and keeps those that use its slot, so a step
reads each resident adapter's weights once per 64 rows, whatever the mix (a decode step is
bound by reading weights). Slot -1 is the base model: nothing is loaded or added for it, and a
program whose slot no row uses touches no memory at all (a base-only decode step of a
LoRA-enabled graph pays launches, not loops).

A decode shrink also splits K (the hidden width, 4096-14336) over programs: an adapter's A is a
few hundred KB per projection, and one program walking all of K serially is a chain of
dependent loads that no other program hides (the first version ran 8 programs a shrink, 3.7 ms
of a 64-row step for 0.14 ms of bytes). Each split writes its own float32 partial
`[splits, T, R_total]` and `expand` sums them as it loads s: no atomics, no zeroing pass.

The adapters' weights are stacked by slot: A `[slots, n_sub * R, K]` (the sub-projections of a
fused projection, q/k/v or gate/up, one after the other, each padded to the pool's rank R) and
B `[slots, N, R]`. `expand` adds every sub-projection's output columns in one launch: a column
finds its sub-projection from the boundaries, and with it its R columns of s.

Both kernels launch as programmatic dependents on Hopper (`triton_support.dependent_launch`),
like the rest of the decode step, and wait for the kernel before them first.

The torch functions are the CPU path and the kernels' reference: they compute every slot's
product and keep each token's own, which costs `slots` times the work but has no Python loop
over adapters either.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixserve.kernels import triton_support
from radixserve.kernels.triton_support import jit, tl, triton, wait_for_prior_kernel

_BLOCK_M = 16  # tokens per program of a segment (tl.dot's smallest tile)
_DECODE_BLOCK_M = 64  # decode rows per program by slot
_DECODE_K_PER_SPLIT = 1024  # a decode shrink's K per program, at most
_MAX_SPLITS = 8  # expand sums every split's partial, its loads all in flight at once
_BLOCK_K = 64  # a prefill shrink's K chunk
_DECODE_BLOCK_K = 256
_DECODE_BLOCK_R = 16  # a decode shrink's rank columns per program: more programs share A
_BLOCK_N = 64  # a prefill expand's output columns per program


def _decode_expand_tile(n: int) -> tuple[int, int]:
    """(output columns, warps) of a decode expand program. Wide tiles: a 64-row step's expand
    of the 8B gate/up (28,672 columns) in 64-column tiles was 3,584 programs and 22 us, each
    a short chain of loads (B, the partials of s, y) whose latency the waves paid in turn."""
    return (256, 8) if n >= 8192 else (128, 4)


@jit
def _program_rows(SegStart, SegSlot, n_rows, BY_SLOT: tl.constexpr, BLOCK_M: tl.constexpr):
    """The slot this program applies and its rows: (slot, rows, live), live the rows that use
    the slot. By segment: program_id(0) is a segment (all its rows live unless its slot is -1).
    By slot (a decode pass, one row per segment): program_id(0) is a slot, and its rows are
    the block's rows whose slot it is, so each adapter's weights are read once per block of
    rows instead of once per row."""
    block = tl.program_id(1)
    if BY_SLOT:
        slot = tl.program_id(0).to(tl.int64)
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_slots = tl.load(SegSlot + rows, mask=rows < n_rows, other=-1)
        live = row_slots == slot
    else:
        seg = tl.program_id(0)
        slot = tl.load(SegSlot + seg).to(tl.int64)
        start = tl.load(SegStart + seg)
        end = tl.load(SegStart + seg + 1)
        rows = start + block * BLOCK_M + tl.arange(0, BLOCK_M)
        live = rows < tl.where(slot >= 0, end, start)  # a base segment (-1): no row
    return slot, rows, live


@jit
def _shrink_kernel(
    X,
    A,
    Out,
    SegStart,
    SegSlot,
    n_rows,
    K,
    r_total,
    k_per_split,
    stride_xm,
    stride_as,
    stride_ar,
    stride_osplit,
    stride_om,
    BY_SLOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_prior_kernel(PDL)
    slot, rows, live = _program_rows(SegStart, SegSlot, n_rows, BY_SLOT, BLOCK_M)
    r_blocks = tl.cdiv(r_total, BLOCK_R)
    split = tl.program_id(2) // r_blocks
    cols = (tl.program_id(2) % r_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)
    col_ok = cols < r_total
    # a program without live rows (a base segment, a slot no row uses) runs no iteration
    any_live = tl.max(live.to(tl.int32), axis=0) > 0
    k_start = split * k_per_split
    k_stop = tl.where(any_live, tl.minimum(k_start + k_per_split, K), k_start)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(k_start, k_stop, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_stop
        x = tl.load(
            X + rows[:, None].to(tl.int64) * stride_xm + ks[None, :],
            mask=live[:, None] & k_ok[None, :],
            other=0.0,
        )
        a = tl.load(
            A + slot * stride_as + cols[None, :].to(tl.int64) * stride_ar + ks[:, None],
            mask=col_ok[None, :] & k_ok[:, None],
            other=0.0,
        )
        acc += tl.dot(x, a, input_precision=PRECISION)
    tl.store(
        Out + split * stride_osplit + rows[:, None].to(tl.int64) * stride_om + cols[None, :],
        acc,
        mask=live[:, None] & col_ok[None, :],
    )


@jit
def _expand_kernel(
    S,
    B,
    Y,
    SegStart,
    SegSlot,
    n_rows,
    N,
    rank,
    splits,
    sub1,
    sub2,
    stride_ssplit,
    stride_sm,
    stride_bs,
    stride_bn,
    stride_ym,
    BY_SLOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_prior_kernel(PDL)
    slot, rows, live = _program_rows(SegStart, SegSlot, n_rows, BY_SLOT, BLOCK_M)
    any_live = tl.max(live.to(tl.int32), axis=0) > 0
    if any_live:
        n0 = tl.program_id(2) * BLOCK_N
        ns = n0 + tl.arange(0, BLOCK_N)
        n_ok = ns < N
        rs = tl.arange(0, BLOCK_R)
        r_ok = rs < rank
        b = tl.load(
            B + slot * stride_bs + ns[None, :].to(tl.int64) * stride_bn + rs[:, None],
            mask=n_ok[None, :] & r_ok[:, None],
            other=0.0,
        )
        # each column's sub-projection (boundaries sub1 <= sub2, N past the last one): its
        # rank columns of s are the sub-projection's
        col_sub = (ns >= sub1).to(tl.int32) + (ns >= sub2).to(tl.int32)
        last = tl.minimum(n0 + BLOCK_N, N) - 1
        first_sub = (n0 >= sub1).to(tl.int32) + (n0 >= sub2).to(tl.int32)
        last_sub = (last >= sub1).to(tl.int32) + (last >= sub2).to(tl.int32)
        delta = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for sub in range(first_sub, last_sub + 1):
            s = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
            # the shrink's K splits, unrolled: their loads are independent and go out together
            # (a loop of them was a chain of L2 round trips, most of a 64-row expand's time)
            for split in tl.static_range(MAX_SPLITS):
                split_rows = live & (rows * 0 + split < splits)
                s += tl.load(
                    S
                    + split * stride_ssplit
                    + rows[:, None].to(tl.int64) * stride_sm
                    + (sub * rank + rs)[None, :],
                    mask=split_rows[:, None] & r_ok[None, :],
                    other=0.0,
                )
            part = tl.dot(s.to(b.dtype), b, input_precision=PRECISION)
            delta += tl.where((col_sub == sub)[None, :], part, 0.0)
        out = Y + rows[:, None].to(tl.int64) * stride_ym + ns[None, :]
        mask = live[:, None] & n_ok[None, :]
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
    """x `[T, K]` times each token's slot's A `[slots, R_total, K]`: float32 partial sums
    `[splits, T, R_total]` whose sum over the first axis is the product (`expand` takes them
    as they are; the rows of base tokens, slot -1, are left as they are: `expand` never reads
    them). `seg_starts` `[segments + 1]` and `seg_slots` `[segments]` (int32, on x's device)
    cut the tokens into runs of one slot; `max_seg_len` 1 (a decode pass) runs the kernels by
    slot; `token_slots` `[T]` is the same per token, which the torch path uses instead."""
    if triton_support.enabled_for(x):
        return _shrink_triton(x, a, seg_starts, seg_slots, max_seg_len)
    assert token_slots is not None
    return shrink_torch(x, a, token_slots).unsqueeze(0)


def expand(
    y: torch.Tensor,
    s: torch.Tensor,
    b: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_slots: torch.Tensor,
    max_seg_len: int,
    token_slots: torch.Tensor | None = None,
    sub_sizes: Sequence[int] | None = None,
) -> None:
    """y `[T, N]` += s (`shrink`'s partials `[splits, T, n_sub * R]`) times each token's slot's
    B `[slots, N, R]`, in place. `sub_sizes` are the widths of the sub-projections fused in y
    (at most three, summing to N; default one): sub-projection i's columns take s's columns
    `[i * R, (i + 1) * R)`."""
    sizes = list(sub_sizes) if sub_sizes is not None else [y.shape[1]]
    if len(sizes) > 3 or sum(sizes) != y.shape[1]:
        raise ValueError(f"sub-projections {sizes} do not make {y.shape[1]} columns")
    if triton_support.enabled_for(y):
        _expand_triton(y, s, b, seg_starts, seg_slots, max_seg_len, sizes)
        return
    assert token_slots is not None
    rank = b.shape[2]
    whole = s.sum(0)
    offset = 0
    for i, size in enumerate(sizes):  # the fused projections: at most three
        expand_torch(
            y[:, offset : offset + size],
            whole[:, i * rank : (i + 1) * rank],
            b[:, offset : offset + size],
            token_slots,
        )
        offset += size


def _shrink_triton(
    x: torch.Tensor,
    a: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_slots: torch.Tensor,
    max_seg_len: int,
) -> torch.Tensor:
    tokens, k = x.shape
    r_total = a.shape[1]
    by_slot, grid, block_m = _layout(a.shape[0], seg_slots.shape[0], max_seg_len)
    # a decode pass splits K and the rank columns so enough programs share the loads; a
    # prefill has its segments
    splits = min(_MAX_SPLITS, triton.cdiv(k, _DECODE_K_PER_SPLIT)) if by_slot else 1
    k_per_split = triton.cdiv(triton.cdiv(k, splits), _BLOCK_K) * _BLOCK_K
    splits = triton.cdiv(k, k_per_split)
    out = torch.empty((splits, tokens, r_total), dtype=torch.float32, device=x.device)
    if tokens == 0 or seg_slots.shape[0] == 0:
        return out
    if by_slot:
        block_k, block_r = _DECODE_BLOCK_K, _DECODE_BLOCK_R
    else:
        block_k, block_r = _BLOCK_K, max(16, min(64, triton.next_power_of_2(r_total)))
    _shrink_kernel[(*grid, splits * triton.cdiv(r_total, block_r))](
        x,
        a,
        out,
        seg_starts,
        seg_slots,
        seg_slots.shape[0],
        k,
        r_total,
        k_per_split,
        x.stride(0),
        a.stride(0),
        a.stride(1),
        out.stride(0),
        out.stride(1),
        BY_SLOT=by_slot,
        BLOCK_M=block_m,
        BLOCK_R=block_r,
        BLOCK_K=block_k,
        PRECISION=triton_support.dot_precision(x.dtype),
        **triton_support.dependent_launch(x),
    )
    return out


def _expand_triton(
    y: torch.Tensor,
    s: torch.Tensor,
    b: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_slots: torch.Tensor,
    max_seg_len: int,
    sizes: list[int],
) -> None:
    tokens, n = y.shape
    rank = b.shape[2]
    segments = seg_slots.shape[0]
    if tokens == 0 or segments == 0:
        return
    bounds = [sum(sizes[: i + 1]) for i in range(len(sizes) - 1)] + [n, n]
    by_slot, grid, block_m = _layout(b.shape[0], segments, max_seg_len)
    block_n, warps = _decode_expand_tile(n) if by_slot else (_BLOCK_N, 4)
    _expand_kernel[(*grid, triton.cdiv(n, block_n))](
        s,
        b,
        y,
        seg_starts,
        seg_slots,
        segments,
        n,
        rank,
        s.shape[0],
        bounds[0],
        bounds[1],
        s.stride(0),
        s.stride(1),
        b.stride(0),
        b.stride(1),
        y.stride(0),
        BY_SLOT=by_slot,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_R=max(16, triton.next_power_of_2(rank)),
        MAX_SPLITS=triton.next_power_of_2(s.shape[0]),
        PRECISION=triton_support.dot_precision(y.dtype),
        num_warps=warps,
        **triton_support.dependent_launch(y),
    )


def _layout(slots: int, segments: int, max_seg_len: int) -> tuple[bool, tuple[int, int], int]:
    """(by slot, the grid's first two axes, rows per program). One-row segments (a decode
    pass) go by slot: a program per slot and block of 64 rows reads its adapter's weights once
    for all the block's rows that use it; longer segments go by segment, 16 rows a program."""
    if max_seg_len == 1:
        return True, (slots, triton.cdiv(segments, _DECODE_BLOCK_M)), _DECODE_BLOCK_M
    return False, (segments, triton.cdiv(max_seg_len, _BLOCK_M)), _BLOCK_M


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
