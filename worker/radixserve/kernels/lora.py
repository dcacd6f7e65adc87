"""LoRA's two batched products, segmented by adapter (Punica's SGMV, S-LoRA's MBGMM): `shrink`
(x · Aᵀ, hidden -> rank) and `expand` (y += s · Bᵀ, rank -> output), for a batch whose rows use
different adapters, in one launch each whatever the mix.

A batch is cut into segments of consecutive tokens that share one adapter slot: a request's
extend tokens, or one decode row. With longer segments a program takes a block of one
segment's tokens and the slot's A or B, so a prefill reads each adapter's weights once per
token block, not once per token. A decode pass (one-row segments) goes by groups instead: the
host sorts the rows by slot and cuts each slot's rows into blocks of at most 16
(`decode_blocks`: a step input, each block its slot and its rows' indices, -1 for an empty
lane), and a program takes one block: its tiles are dense (every row of a tile uses the tile's
adapter), it gathers its rows' x and s by index and adds into their rows of y in place (no
scatter pass). The block table has a fixed length for a given row count (`max_decode_blocks`:
blocks of 16 over the rows, plus one partial block per further adapter), so a captured graph
replays any mix. The previous layout, a program per slot over a block of 64 rows keeping those
of its slot, ran 8 live rows in a 64-row tile at batch 64 over 8 adapters (the gate/up expand
19 us a layer, H200) and a program per slot even for slots no row used. Slot -1 is the base
model: nothing is loaded or added for it, and a block without rows touches no memory.

A decode shrink also splits K (the hidden width, 4096-14336) over programs: an adapter's A is a
few hundred KB per projection, and one program walking all of K serially is a chain of
dependent loads that no other program hides (the first version ran 8 programs a shrink, 3.7 ms
of a 64-row step for 0.14 ms of bytes). Each split writes its own float32 partial
`[splits, T, R_total]` and `expand` sums them as it loads s: no atomics, no zeroing pass.
A decode pass's tiles (the shrink's chunk, rank block, split, warps, stages; the expand's
columns, warps, stages) come from `shrink_config` and `expand_config` by shape and row count, or
from the caller (scripts/gpu/lora_bench.py's sweep over `SHRINK_SWEEP` and `EXPAND_SWEEP`).

One row (batch 1) has its own shrink, `_shrink_row_kernel`: there the LoRA work is a chain of
small launches between the step's GEMVs, and what each costs is its time after its wait for the
kernel before, not its bytes (the grouped shrink, which reads A after that wait in a loop of
dependent chunks over 4-8 programs, took ~2.9 us a launch against 0.73 for an empty launch,
H200 2026-12-04). A program takes one rank column over the whole of K and reads its A row
before the wait (A is a constant, the row's slot a step input), so after the wait it reads
only x, which the kernel before has just written (L2), and stores its column of s whole.

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
from typing import NamedTuple

import torch

from radixserve.kernels import triton_support
from radixserve.kernels.triton_support import jit, tl, triton, wait_for_prior_kernel

_BLOCK_M = 16  # tokens per program of a segment (tl.dot's smallest tile)
DECODE_BLOCK_M = 16  # a decode block's rows, all of one adapter (tl.dot's smallest tile)
_BLOCK_K = 64  # a prefill shrink's K chunk
_BLOCK_N = 64  # a prefill expand's output columns per program


class Layout(NamedTuple):
    """A pass's rows by adapter slot, as the kernels read them (layers/lora_linear.LoRABatch
    writes it into fixed device buffers each pass). `seg_starts` `[segments + 1]` and
    `seg_slots` `[segments]` cut the tokens into runs of one slot; `max_seg_len` 1 (a decode
    pass) runs the kernels by `blocks` (`decode_blocks`, `[max_decode_blocks, 1 +
    DECODE_BLOCK_M]`); `token_slots` `[T]`, a slot per token, is what the torch path reads.
    All int32 on the pass's device."""

    seg_starts: torch.Tensor
    seg_slots: torch.Tensor
    max_seg_len: int
    blocks: torch.Tensor
    token_slots: torch.Tensor | None = None


def max_decode_blocks(rows: int, slots: int) -> int:
    """The decode block table's length for `rows` rows over at most `slots` adapters: each
    adapter's rows take ceil(n / 16) blocks, at most rows / 16 rounded up plus one partial
    block per adapter after the first."""
    return -(-rows // DECODE_BLOCK_M) + max(min(slots, rows) - 1, 0)


def decode_blocks(row_slots: Sequence[int], slots: int) -> list[int]:
    """The decode block table of rows using `row_slots` (-1: the base, in no block), flat:
    `max_decode_blocks` entries of (slot, DECODE_BLOCK_M row indices, -1 for an empty lane),
    the rows grouped by slot. Host work of one pass (a few tens of us at 256 rows), sent with
    the pass's other inputs."""
    by_slot: dict[int, list[int]] = {}
    for row, slot in enumerate(row_slots):
        if slot >= 0:
            by_slot.setdefault(slot, []).append(row)
    count = max_decode_blocks(len(row_slots), slots)
    width = 1 + DECODE_BLOCK_M
    table = [-1] * (count * width)
    block = 0
    for slot in sorted(by_slot):
        rows = by_slot[slot]
        for first in range(0, len(rows), DECODE_BLOCK_M):
            chunk = rows[first : first + DECODE_BLOCK_M]
            table[block * width] = slot
            table[block * width + 1 : block * width + 1 + len(chunk)] = chunk
            block += 1
    assert block <= count, f"{block} decode blocks exceed {count}"
    return table


class ShrinkConfig(NamedTuple):
    """A decode shrink's tiles: K chunk and rank columns of a program's dot, K per program
    (the split: the last one short, rounded up to the chunk), at most `max_splits` splits
    (expand unrolls a load per split), warps and pipeline stages."""

    block_k: int
    block_r: int
    k_per_split: int
    max_splits: int
    warps: int
    stages: int


class ExpandConfig(NamedTuple):
    """A decode expand's tiles: output columns a program, warps and pipeline stages (of the
    loop over the sub-projections a tile covers: usually one iteration)."""

    block_n: int
    warps: int
    stages: int


def shrink_config(k: int, r_total: int, rows: int) -> ShrinkConfig:
    """The decode shrink's tiles for x `[rows, k]` times A `[slots, r_total, k]`.

    One row takes `_shrink_row_kernel` instead. More rows go by 16-row blocks of one adapter (at
    batch 64 over 8 adapters, 8 live rows in each of 8 blocks, 3 empty). The shrink's time is
    its programs' chains of dependent K chunks more than its bytes, so more splits pay where K
    is short: measured (lora_bench.py `kernels --sweep`, one H200, 2026-12-04, 64 rows over 8
    adapters, a step over 32 layers), 512 K a split (8 at K 4096) took the q/k/v shrink from 122
    to 91 us and o's from 96 to 70, gate/up even; 256-wide chunks, 4 warps and 3 stages were the
    best or within 3% of it on every projection. The down projection (K 14336) keeps 8 splits of
    1792: its expand then sums 8 partials, not 14, and the pair measured 252 us against 270 with
    1024 a split. `r_total` is in the key for a later sweep; these do not depend on it."""
    if k <= 8192:
        return ShrinkConfig(256, 16, 512, 16, 4, 3)
    return ShrinkConfig(256, 16, 1024, 8, 4, 3)


def expand_config(n: int, rank: int, rows: int) -> ExpandConfig:
    """The decode expand's tiles for y `[rows, n]` += s · B `[slots, n, rank]`.

    One row (batch 1, only q/k/v: the other projections add their expand in the GEMV's
    epilogue): the tiles it ran with, 256 columns over 8 warps from 8192 columns, else 128
    over 4, Triton's default 3 stages.

    More rows, by 16-row blocks: a program loads B [BLOCK_N, 16] (issued before the wait for
    the kernel before), every split's s [16, 16], makes one 16 x 16 x BLOCK_N dot and reads,
    adds and writes y [16, BLOCK_N]. Measured (lora_bench.py `kernels --sweep`, one H200,
    2026-12-04, 64 rows over 8 adapters): 256 columns over 4 warps with 3 stages was the
    fastest of 12 candidates on all four projections (gate/up 263 us a step; 128 columns over
    4 warps, 1 stage, the first guess for 16-row blocks, 336; 64 columns for o and down 127
    and 143 against 91 and 135). `rank` is in the key for a later sweep."""
    if rows <= 1:
        return ExpandConfig(256 if n >= 8192 else 128, 8 if n >= 8192 else 4, 3)
    return ExpandConfig(256, 4, 3)


# The candidates scripts/gpu/lora_bench.py's tile sweep times at 64 rows over 8 adapters, each
# projection (tests/unit/test_lora_tiles_interpret.py checks every one against the reference).
# Bounded to 31 a projection (~30 compilations: the split is not a constexpr, the expand's
# unrolled split count is; each candidate timed by 11 replays of a 32-layer graph, so the
# compilations are most of the sweep's ~1 min): the shrink's chunk, split and warps at three
# stages (its loop is 1-16 chunks a split), and the 64-row tiles before this config (8 splits at
# most); the expand's columns, warps and one or three stages (its loop runs once or twice:
# 2 and 4 change only the prologue).
SHRINK_SWEEP: tuple[ShrinkConfig, ...] = (
    ShrinkConfig(256, 16, 1024, 8, 4, 3),
    *(
        ShrinkConfig(block_k, 16, split, 16, warps, 3)
        for block_k in (128, 256, 512)
        for split in (512, 1024, 2048)
        for warps in (4, 8)
    ),
)
EXPAND_SWEEP: tuple[ExpandConfig, ...] = tuple(
    ExpandConfig(block_n, warps, stages)
    for block_n in (64, 128, 256)
    for warps in (4, 8)
    for stages in (1, 3)
)


@jit
def _program_rows(SegStart, SegSlot, Blocks, GROUPED: tl.constexpr, BLOCK_M: tl.constexpr):
    """The slot this program applies and its rows: (slot, rows, live), live the rows that use
    the slot. By segment: program_id(0) is a segment (all its rows live unless its slot is -1).
    Grouped (a decode pass, one row per segment): program_id(0) is a block of `decode_blocks`,
    its slot and its rows' indices read together (one round trip, as the segment's bounds)."""
    block = tl.program_id(1)
    if GROUPED:
        entry = Blocks + tl.program_id(0) * (BLOCK_M + 1)
        slot = tl.load(entry).to(tl.int64)
        lanes = tl.load(entry + 1 + tl.arange(0, BLOCK_M))
        live = lanes >= 0
        rows = tl.maximum(lanes, 0)
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
    Blocks,
    K,
    r_total,
    k_per_split,
    stride_xm,
    stride_as,
    stride_ar,
    stride_osplit,
    stride_om,
    GROUPED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    # the layout is a step input, copied before the pass: read before the wait, its round trip
    # overlaps the kernel before (see `wait_for_prior_kernel`)
    slot, rows, live = _program_rows(SegStart, SegSlot, Blocks, GROUPED, BLOCK_M)
    wait_for_prior_kernel(PDL)
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
def _shrink_row_kernel(
    X,
    A,
    Out,
    SegSlot,
    K,
    stride_as,
    stride_ar,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """One row's x `[K]` times its slot's A: program r sums the whole of K for rank column r
    into `Out[0, 0, r]`, so the product leaves complete, one split (every program of the GEMV
    after it reads s in its epilogue: 16-28 partials each, read by thousands of programs, cost
    more than the shrink saved, H200 2026-12-04). The A row (8-28 KB) is read before the wait,
    the only read after it is x (the kernel before's output, in L2); the next kernel (the GEMV)
    launches first, its own early reads being constants too. A base row (slot -1) reads no A
    and stores zero (nothing reads it)."""
    r = tl.program_id(0)
    ks = tl.arange(0, BLOCK_K)
    k_ok = ks < K
    slot = tl.load(SegSlot).to(tl.int64)
    on = k_ok & (ks * 0 + slot >= 0)  # (vector-shaped: the interpreter's masks)
    a = tl.load(A + tl.maximum(slot, 0) * stride_as + r * stride_ar + ks, mask=on, other=0.0)
    wait_for_prior_kernel(PDL, LAUNCH_NEXT_FIRST=True)
    x = tl.load(X + ks, mask=k_ok, other=0.0)
    tl.store(Out + r, tl.sum(a.to(tl.float32) * x.to(tl.float32), axis=0))


@jit
def _expand_kernel(
    S,
    B,
    Y,
    SegStart,
    SegSlot,
    Blocks,
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
    GROUPED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    slot, rows, live = _program_rows(SegStart, SegSlot, Blocks, GROUPED, BLOCK_M)
    any_live = tl.max(live.to(tl.int32), axis=0) > 0
    n0 = tl.program_id(2) * BLOCK_N
    ns = n0 + tl.arange(0, BLOCK_N)
    n_ok = ns < N
    rs = tl.arange(0, BLOCK_R)
    r_ok = rs < rank
    # the adapter's B is a constant of the step: read before the wait too, it streams while
    # the kernel before ends (nothing is held across a loop)
    cols_read = n_ok & (ns * 0 + any_live.to(tl.int32) > 0)  # (vector-shaped: the interpreter)
    b = tl.load(
        B + tl.maximum(slot, 0) * stride_bs + ns[None, :].to(tl.int64) * stride_bn + rs[:, None],
        mask=cols_read[None, :] & r_ok[:, None],
        other=0.0,
    )
    wait_for_prior_kernel(PDL)
    if any_live:
        # y (the base product, the kernel before's output: after the wait) is read before s, so
        # its round trip to HBM overlaps s's to L2 and the dot rather than following them
        out = Y + rows[:, None].to(tl.int64) * stride_ym + ns[None, :]
        mask = live[:, None] & n_ok[None, :]
        y = tl.load(out, mask=mask, other=0.0)
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
        tl.store(out, (y.to(tl.float32) + delta).to(y.dtype), mask=mask)


def shrink(
    x: torch.Tensor, a: torch.Tensor, layout: Layout, config: ShrinkConfig | None = None
) -> torch.Tensor:
    """x `[T, K]` times each token's slot's A `[slots, R_total, K]` (`layout` says which):
    float32 partial sums `[splits, T, R_total]` whose sum over the first axis is the product
    (`expand` takes them as they are; the rows of base tokens, slot -1, are left as they are:
    `expand` never reads them). `config`: a decode pass's tiles, by default `shrink_config`'s
    (a bench's sweep passes its candidates; a prefill has its own). One row without a
    `config` takes `_shrink_row_kernel`."""
    if triton_support.enabled_for(x):
        if x.shape[0] == 1 and layout.seg_slots.shape[0] == 1 and config is None:
            return _shrink_row(x, a, layout.seg_slots)
        return _shrink_triton(x, a, layout, config)
    assert layout.token_slots is not None
    return shrink_torch(x, a, layout.token_slots).unsqueeze(0)


def expand(
    y: torch.Tensor,
    s: torch.Tensor,
    b: torch.Tensor,
    layout: Layout,
    sub_sizes: Sequence[int] | None = None,
    config: ExpandConfig | None = None,
) -> None:
    """y `[T, N]` += s (`shrink`'s partials `[splits, T, n_sub * R]`) times each token's slot's
    B `[slots, N, R]`, in place. `sub_sizes` are the widths of the sub-projections fused in y
    (at most three, summing to N; default one): sub-projection i's columns take s's columns
    `[i * R, (i + 1) * R)`. `config`: a decode pass's tiles, by default `expand_config`'s."""
    sizes = list(sub_sizes) if sub_sizes is not None else [y.shape[1]]
    if len(sizes) > 3 or sum(sizes) != y.shape[1]:
        raise ValueError(f"sub-projections {sizes} do not make {y.shape[1]} columns")
    if triton_support.enabled_for(y):
        _expand_triton(y, s, b, layout, sizes, config)
        return
    token_slots = layout.token_slots
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


def _shrink_row(x: torch.Tensor, a: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    k, r_total = x.shape[1], a.shape[1]
    out = torch.empty((1, 1, r_total), dtype=torch.float32, device=x.device)
    block_k = triton.next_power_of_2(k)
    _shrink_row_kernel[(r_total,)](
        x.contiguous(),
        a,
        out,
        slot,
        k,
        a.stride(0),
        a.stride(1),
        BLOCK_K=block_k,
        num_warps=4 if block_k <= 4096 else 8,
        **triton_support.dependent_launch(x),
    )
    return out


def _shrink_triton(
    x: torch.Tensor, a: torch.Tensor, layout: Layout, config: ShrinkConfig | None
) -> torch.Tensor:
    tokens, k = x.shape
    r_total = a.shape[1]
    grouped, grid, block_m = _grid(layout)
    if grouped:
        # a decode pass splits K and the rank columns so enough programs share the loads
        tile = config or shrink_config(k, r_total, tokens)
        block_k, block_r, warps, stages = tile.block_k, tile.block_r, tile.warps, tile.stages
        splits = min(tile.max_splits, triton.cdiv(k, tile.k_per_split))
        k_per_split = triton.cdiv(triton.cdiv(k, splits), block_k) * block_k
        splits = triton.cdiv(k, k_per_split)
    else:  # a prefill has its segments
        block_k, block_r = _BLOCK_K, max(16, min(64, triton.next_power_of_2(r_total)))
        warps, stages, splits, k_per_split = 4, 3, 1, triton.cdiv(k, _BLOCK_K) * _BLOCK_K
    out = torch.empty((splits, tokens, r_total), dtype=torch.float32, device=x.device)
    if tokens == 0 or grid[0] == 0:
        return out
    _shrink_kernel[(*grid, splits * triton.cdiv(r_total, block_r))](
        x,
        a,
        out,
        layout.seg_starts,
        layout.seg_slots,
        layout.blocks,
        k,
        r_total,
        k_per_split,
        x.stride(0),
        a.stride(0),
        a.stride(1),
        out.stride(0),
        out.stride(1),
        GROUPED=grouped,
        BLOCK_M=block_m,
        BLOCK_R=block_r,
        BLOCK_K=block_k,
        PRECISION=triton_support.dot_precision(x.dtype),
        num_warps=warps,
        num_stages=stages,
        **triton_support.dependent_launch(x),
    )
    return out


def _expand_triton(
    y: torch.Tensor,
    s: torch.Tensor,
    b: torch.Tensor,
    layout: Layout,
    sizes: list[int],
    config: ExpandConfig | None,
) -> None:
    tokens, n = y.shape
    rank = b.shape[2]
    grouped, grid, block_m = _grid(layout)
    if tokens == 0 or grid[0] == 0:
        return
    bounds = [sum(sizes[: i + 1]) for i in range(len(sizes) - 1)] + [n, n]
    block_n, warps, stages = (
        (config or expand_config(n, rank, tokens)) if grouped else (_BLOCK_N, 4, 3)
    )
    _expand_kernel[(*grid, triton.cdiv(n, block_n))](
        s,
        b,
        y,
        layout.seg_starts,
        layout.seg_slots,
        layout.blocks,
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
        GROUPED=grouped,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_R=max(16, triton.next_power_of_2(rank)),
        MAX_SPLITS=triton.next_power_of_2(s.shape[0]),
        PRECISION=triton_support.dot_precision(y.dtype),
        num_warps=warps,
        num_stages=stages,
        **triton_support.dependent_launch(y),
    )


def _grid(layout: Layout) -> tuple[bool, tuple[int, int], int]:
    """(grouped, the grid's first two axes, rows per program). One-row segments (a decode
    pass) go by the block table: a program per block of one adapter's rows; longer segments go
    by segment, 16 rows a program."""
    if layout.max_seg_len == 1:
        return True, (layout.blocks.shape[0], 1), DECODE_BLOCK_M
    return False, (layout.seg_slots.shape[0], triton.cdiv(layout.max_seg_len, _BLOCK_M)), _BLOCK_M


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
