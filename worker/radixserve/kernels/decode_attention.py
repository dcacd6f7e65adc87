"""Paged decode attention in Triton: one new query token per request against its whole KV.

Decode is bound by reading the KV cache, and with few requests there are too few (request, kv
head) pairs to fill the GPU. So the KV of each request is cut into `num_kv_splits` pieces
(split-KV, "flash decoding"): stage 1 runs one program per (request, kv head, split) and writes
a partial output with its log-sum-exp; stage 2 merges the splits of each (request, head).

Grouped-query attention: a stage-1 program loads every query head that shares its kv head
(padded to 16 rows so `tl.dot` can use the tensor cores), so each K/V tile is read once per
group instead of once per query head. KV slots are looked up through
`req_to_token[req_pool_index, position]`, so the pool's slots can lie anywhere.

A sliding window W makes the KV of a request its last W tokens: the splits cut that range
(computed on the device from seq_len, so a captured graph stays valid). A logit soft-cap
applies cap * tanh(score / cap) to the scores; FP8 KV is read as stored and its per-tensor
scales are folded in (k's into the score scale, v's into the output). Attention sinks (a
learned logit per head in the softmax's denominator, gpt-oss) join in the merge, once per head,
whatever the split count.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixserve.kernels.triton_support import dependent_launch, dot_precision, wait_for_prior_kernel

# Smallest piece of KV a split gets: shorter splits would spend more on the merge than they save.
_MIN_SPLIT_TOKENS = 64
_BLOCK_N = 64
MAX_KV_SPLITS = 64
# Programs per SM the split count aims for: decode programs are latency-bound (a chain of
# dependent gathers), so the SMs need several each to hide it. Measured on an H100
# (benchmark-log.md, 2026-12-05 night): batches of 2-32 at 8 kv heads, which give at most 2 an
# SM alone, are up to 10% faster at 2 an SM, rounded down, than at 4 (fewer, longer splits);
# a batch that gives more keeps 4 (at 64 requests two splits beat one by 6-7%), and so does a
# batch of one: in the step 64 splits beat 17 by 95 us at 3,500 tokens (2026-12-03), and 33,
# 2-8% faster alone, was even with 64 in the 8B step at 3,500 tokens (5.548 / 5.550 against
# 5.543 / 5.545 ms, 2026-12-05 late evening). Other kv head counts follow the program count:
# Qwen3-30B-A3B's 4 take one split at batch 64 where they took three, and its step measured
# 1.2% faster for it (23.73 against 24.02-24.03 ms, the same evening); a tensor-parallel
# rank's are unmeasured.
_PROGRAMS_PER_SM = 4
_PROGRAMS_PER_SM_BETWEEN = 2
# Filled splits the merge takes in a short tile (a 512-token context fills 9 of 64)
_FEW_SPLITS = 16


@triton.jit
def _window_start(seq_len, window):
    """First visible key of the request's newest query: seq_len - W with a window W > 0."""
    return tl.maximum(seq_len - tl.where(window > 0, window, seq_len), 0)


@triton.jit
def _split_len(kv_len, num_kv_splits, MIN_SPLIT: tl.constexpr):
    return tl.cdiv(tl.cdiv(kv_len, num_kv_splits), MIN_SPLIT) * MIN_SPLIT


@triton.jit
def _split_bounds(kv_start, seq_len, split_id, num_kv_splits, MIN_SPLIT: tl.constexpr):
    """[start, end) of one split of the keys [kv_start, seq_len); stage 1 and stage 2 must
    agree on it."""
    split_len = _split_len(seq_len - kv_start, num_kv_splits, MIN_SPLIT)
    start = kv_start + split_len * split_id
    end = tl.minimum(start + split_len, seq_len)
    return start, end


@triton.jit
def soft_cap_log2(qk, sm_scale, cap, HAS_CAP: tl.constexpr):
    """Raw q.k scores -> base-2 logits: scaled, and with HAS_CAP soft-capped first,
    cap * tanh(s / cap) (tanh as 1 - 2 / (1 + e^2x): exact at both ends, no overflow)."""
    s = qk * sm_scale
    if HAS_CAP:
        s = cap * (1.0 - 2.0 / (1.0 + tl.exp(2.0 * s / cap)))
    return s * 1.4426950408889634


@triton.jit
def _decode_grouped_split_kernel(
    Q,
    K_Buffer,
    V_Buffer,
    Req_to_token,
    Req_pool_indices,
    Seq_lens,
    Mid_O,
    Mid_Lse,
    sm_scale,
    logit_cap,
    v_scale,
    window,
    num_kv_splits,
    stride_r2t,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_vb,
    stride_vh,
    stride_mob,
    stride_moh,
    stride_mos,
    stride_mlb,
    stride_mlh,
    GROUP_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MIN_SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_CAP: tl.constexpr,
    PDL: tl.constexpr,
):
    batch = tl.program_id(0)
    kv_head = tl.program_id(1)
    split_id = tl.program_id(2)

    offs_g = tl.arange(0, BLOCK_H)
    mask_g = offs_g < GROUP_SIZE
    heads = kv_head * GROUP_SIZE + offs_g
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM

    # the request's length and its first tile's KV slots are step inputs: read before the
    # wait, that chain of two lookups leaves the critical path
    seq_len = tl.load(Seq_lens + batch).to(tl.int32)
    slot_row = Req_to_token + tl.load(Req_pool_indices + batch).to(tl.int64) * stride_r2t
    kv_start = _window_start(seq_len, window)
    start, end = _split_bounds(kv_start, seq_len, split_id, num_kv_splits, MIN_SPLIT)
    offs_n = start + tl.arange(0, BLOCK_N)
    slots = tl.load(slot_row + offs_n, mask=offs_n < end, other=0)
    wait_for_prior_kernel(PDL)
    if end > start:
        q = tl.load(
            Q + batch * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
            mask=mask_g[:, None] & mask_d[None, :],
            other=0.0,
        )
        m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
        for start_n in range(start, end, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            mask_n = offs_n < end
            tile = slots.to(tl.int64)
            # the next tile's slots, asked for before this tile's K and V are used
            slots = tl.load(slot_row + offs_n + BLOCK_N, mask=offs_n + BLOCK_N < end, other=0)
            k = tl.load(
                K_Buffer + tile[None, :] * stride_kb + kv_head * stride_kh + offs_d[:, None],
                mask=mask_n[None, :] & mask_d[:, None],
                other=0.0,
            )
            qk = tl.dot(q, k.to(q.dtype), input_precision=DOT_PRECISION)
            qk = soft_cap_log2(qk, sm_scale, logit_cap, HAS_CAP)
            qk = tl.where(mask_n[None, :], qk, float("-inf"))
            v = tl.load(
                V_Buffer + tile[:, None] * stride_vb + kv_head * stride_vh + offs_d[None, :],
                mask=mask_n[:, None] & mask_d[None, :],
                other=0.0,
            )
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(
                p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION
            )
            m_i = m_new
        out_mask = mask_g[:, None] & mask_d[None, :]
        tl.store(
            Mid_O
            + batch * stride_mob
            + heads[:, None] * stride_moh
            + split_id * stride_mos
            + offs_d[None, :],
            acc * (v_scale / l_i[:, None]),
            mask=out_mask,
        )
        tl.store(
            Mid_Lse + batch * stride_mlb + heads * stride_mlh + split_id,
            m_i + tl.log2(l_i),
            mask=mask_g,
        )


@triton.jit
def sink_log2(Sinks, head, HAS_SINKS: tl.constexpr):
    """A head's sink logit in base-2 units (the kernels' logits), -inf without sinks."""
    if HAS_SINKS:
        return tl.load(Sinks + head).to(tl.float32) * 1.4426950408889634
    return float("-inf")


@triton.jit
def _merged_splits(
    lse_row, out_row, filled, stride_mos, offs_d, mask_d, sink, BLOCK_S: tl.constexpr
):
    """The first `filled` splits of one (request, head) merged, read as one [BLOCK_S,
    head_dim] tile: a loop over the splits would be a chain of dependent loads, and at batch 1
    that chain is the kernel's time. `sink` (base 2, -inf for none) adds its weight to the
    denominator only."""
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < filled
    lse = tl.load(lse_row + offs_s, mask=mask_s, other=float("-inf"))
    top = tl.maximum(tl.max(lse, 0), sink)
    weights = tl.exp2(lse - top)
    parts = tl.load(
        out_row + offs_s[:, None] * stride_mos + offs_d[None, :],
        mask=mask_s[:, None] & mask_d[None, :],
        other=0.0,
    )
    return tl.sum(parts * weights[:, None], 0) / (tl.sum(weights, 0) + tl.exp2(sink - top))


@triton.jit
def _decode_merge_splits_kernel(
    Mid_O,
    Mid_Lse,
    Out,
    Seq_lens,
    Sinks,
    window,
    num_kv_splits,
    stride_mob,
    stride_moh,
    stride_mos,
    stride_mlb,
    stride_mlh,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    FEW_SPLITS: tl.constexpr,
    MIN_SPLIT: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    PDL: tl.constexpr,
):
    """All of a (request, head)'s filled splits merged at once, BLOCK_D of the head's values
    a program (program_id(2)): a [splits, head_dim] tile of MLA's 512-wide latent would not
    fit in registers. A short sequence fills few of the splits (9 of 64 at 512 tokens), and a
    tile as tall as every split then spends its registers and reductions on empty rows: up to
    FEW_SPLITS filled, a tile that tall merges them."""
    batch = tl.program_id(0)
    head = tl.program_id(1)
    offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    seq_len = tl.load(Seq_lens + batch).to(tl.int32)  # a step input: read before the wait
    wait_for_prior_kernel(PDL)
    kv_len = seq_len - _window_start(seq_len, window)
    split_len = _split_len(kv_len, num_kv_splits, MIN_SPLIT)
    filled = tl.cdiv(kv_len, split_len)  # the splits _split_bounds left non-empty
    lse_row = Mid_Lse + batch * stride_mlb + head * stride_mlh
    out_row = Mid_O + batch * stride_mob + head * stride_moh
    sink = sink_log2(Sinks, head, HAS_SINKS)
    if filled <= FEW_SPLITS:
        out = _merged_splits(lse_row, out_row, filled, stride_mos, offs_d, mask_d, sink, FEW_SPLITS)
    else:
        out = _merged_splits(lse_row, out_row, filled, stride_mos, offs_d, mask_d, sink, BLOCK_S)
    tl.store(
        Out + batch * stride_ob + head * stride_oh + offs_d,
        out.to(Out.dtype.element_ty),
        mask=mask_d,
    )


def choose_num_kv_splits(batch_size: int, num_kv_heads: int, num_sms: int) -> int:
    """Enough splits that (requests x kv heads x splits) gives each SM a few programs: 4 for a
    batch of one and for a batch that gives more than 2 an SM alone, 2 (rounded down) for the
    batches between (measured: see _PROGRAMS_PER_SM).

    It depends on the batch size alone (not on sequence lengths), so a CUDA graph captured
    for one batch size stays valid for any lengths replayed into it.
    """
    programs = max(1, batch_size * num_kv_heads)
    if batch_size > 1 and programs <= _PROGRAMS_PER_SM_BETWEEN * num_sms:
        return max(1, min(MAX_KV_SPLITS, _PROGRAMS_PER_SM_BETWEEN * num_sms // programs))
    return max(1, min(MAX_KV_SPLITS, triton.cdiv(_PROGRAMS_PER_SM * num_sms, programs)))


def scratch_rows(max_bs: int, num_kv_heads: int, num_sms: int) -> int:
    """The most (request, split) pairs any batch size up to max_bs needs: sizes one flat
    scratch buffer that every captured batch size views."""
    return max(bs * choose_num_kv_splits(bs, num_kv_heads, num_sms) for bs in range(1, max_bs + 1))


def decode_attention_fwd(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    o: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    mid_o: torch.Tensor,
    mid_lse: torch.Tensor,
    num_kv_splits: int,
    sm_scale: float,
    sliding_window: int = -1,
    logit_cap: float = 0.0,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    sinks: torch.Tensor | None = None,
) -> None:
    """o[b, h] = softmax(q[b, h] . K[b]^T * sm_scale) V[b] over the first seq_lens[b] tokens
    (the last `sliding_window` of them if it is positive; scores soft-capped at `logit_cap`
    if positive). K and V are the buffers' values times k_scale and v_scale. `sinks`
    ([q_heads], natural-log logits) join each head's softmax denominator.

    q, o: [bs, q_heads, head_dim]; k_buffer, v_buffer: [slots, kv_heads, head_dim];
    mid_o: [>= bs, q_heads, >= num_kv_splits, head_dim] float32 and mid_lse:
    [>= bs, q_heads, >= num_kv_splits] float32 are scratch (partial outputs and their base-2
    log-sum-exp). Every seq_len must be >= 1.
    """
    bs, num_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    group_size = num_heads // num_kv_heads
    block_d = triton.next_power_of_2(head_dim)
    block_h = max(16, triton.next_power_of_2(group_size))
    _decode_grouped_split_kernel[(bs, num_kv_heads, num_kv_splits)](
        q,
        k_buffer,
        v_buffer,
        req_to_token,
        req_pool_indices,
        seq_lens,
        mid_o,
        mid_lse,
        sm_scale * k_scale,
        logit_cap,
        v_scale,
        sliding_window,
        num_kv_splits,
        req_to_token.stride(0),
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
        GROUP_SIZE=group_size,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_H=block_h,
        BLOCK_N=_BLOCK_N,
        MIN_SPLIT=_MIN_SPLIT_TOKENS,
        DOT_PRECISION=dot_precision(q.dtype),
        HAS_CAP=logit_cap > 0,
        num_warps=4,
        num_stages=2,
        **dependent_launch(q),
    )
    merge_splits(mid_o, mid_lse, o, seq_lens, num_kv_splits, block_d, sliding_window, sinks)


def merge_splits(
    mid_o: torch.Tensor,
    mid_lse: torch.Tensor,
    o: torch.Tensor,
    seq_lens: torch.Tensor,
    num_kv_splits: int,
    block_d: int,
    sliding_window: int = -1,
    sinks: torch.Tensor | None = None,
) -> None:
    """Stage 2, shared by the decode kernels here and MLA's (kernels/mla_decode.py): o[b, h] =
    the splits of (b, h) that stage 1 filled, weighted by their log-sum-exp. The splits must
    be cut as `_split_bounds` cuts them. mid_o [>= bs, heads, >= splits, head_dim], mid_lse
    [>= bs, heads, >= splits] float32; o [bs, heads, head_dim], any strides with a unit last
    one. One program merges block_d values of a head (a power of two)."""
    bs, num_heads, head_dim = o.shape
    _decode_merge_splits_kernel[(bs, num_heads, triton.cdiv(head_dim, block_d))](
        mid_o,
        mid_lse,
        o,
        seq_lens,
        sinks if sinks is not None else seq_lens,  # never read without sinks
        sliding_window,
        num_kv_splits,
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
        o.stride(0),
        o.stride(1),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_S=triton.next_power_of_2(num_kv_splits),
        FEW_SPLITS=min(_FEW_SPLITS, triton.next_power_of_2(num_kv_splits)),
        MIN_SPLIT=_MIN_SPLIT_TOKENS,
        HAS_SINKS=sinks is not None,
        num_warps=4 if min(block_d, head_dim) >= 128 else 2,
        **dependent_launch(o),
    )
