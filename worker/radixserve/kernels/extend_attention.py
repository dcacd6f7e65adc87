"""Paged extend (prefill) attention in Triton, with a cached prefix.

Each request brings `extend_len` new tokens after `prefix_len` tokens already in the KV pool
(a radix-cache hit, or earlier chunks of a chunked prefill). One program handles a tile of
BLOCK_M new tokens of one query head and makes two passes with one online softmax:

1. the prefix: every query of the tile sees every prefix token, read from the pool through
   `req_to_token[req_pool_index, 0:prefix_len]` (no mask but the length);
2. the new tokens: read contiguously from this pass's k/v (no pool lookup), with the causal
   mask `key position <= query position`, stopping at the tile's last query.

So prefix tokens never need to be copied, and the new K/V need not be in the pool yet.
A sliding window W also hides keys W or more positions behind a query (both passes start at
the tile's first visible key); a logit soft-cap and FP8 prefix scales are applied as in decode,
and a head's attention sink joins the softmax's denominator once, after both passes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixserve.kernels.decode_attention import dot_precision, sink_log2, soft_cap_log2


@triton.jit
def online_softmax_step(qk, v, m_i, l_i, acc, DOT_PRECISION: tl.constexpr):
    """Fold one [BLOCK_M, BLOCK_N] tile of scores (base-2 logits) and its values into the
    running state. A row that has seen no visible key yet (a sliding window can hide a whole
    tile from it) keeps its empty state instead of turning into -inf - -inf = nan."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(qk - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _extend_kernel(
    Q,
    K_Extend,
    V_Extend,
    Out,
    K_Buffer,
    V_Buffer,
    Req_to_token,
    Req_pool_indices,
    Prefix_lens,
    Extend_lens,
    Extend_start_loc,
    Sinks,
    sm_scale,
    logit_cap,
    k_scale,
    v_scale,
    window,
    stride_r2t,
    stride_qt,
    stride_qh,
    stride_ket,
    stride_keh,
    stride_vet,
    stride_veh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_kh,
    stride_vb,
    stride_vh,
    GROUP_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_CAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    block_m = tl.program_id(2)
    kv_head = head // GROUP_SIZE

    extend_len = tl.load(Extend_lens + req).to(tl.int32)
    if block_m * BLOCK_M < extend_len:
        prefix_len = tl.load(Prefix_lens + req).to(tl.int32)
        token_start = tl.load(Extend_start_loc + req).to(tl.int64)
        req_row = tl.load(Req_pool_indices + req).to(tl.int64)

        offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query index within the extend
        mask_m = offs_m < extend_len
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < HEAD_DIM
        offs_n = tl.arange(0, BLOCK_N)

        q = tl.load(
            Q + (token_start + offs_m[:, None]) * stride_qt + head * stride_qh + offs_d[None, :],
            mask=mask_m[:, None] & mask_d[None, :],
            other=0.0,
        )
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        # Pass 1: the cached prefix, through req_to_token. With a window the tile's first
        # query (position prefix_len + block_m * BLOCK_M) sees nothing before its window.
        prefix_start = 0
        if HAS_WINDOW:
            prefix_start = tl.maximum(prefix_len + block_m * BLOCK_M - window + 1, 0)
        for start_n in range(prefix_start, prefix_len, BLOCK_N):
            pos = start_n + offs_n
            mask_n = pos < prefix_len
            slots = tl.load(Req_to_token + req_row * stride_r2t + pos, mask=mask_n, other=0)
            slots = slots.to(tl.int64)
            k = tl.load(
                K_Buffer + slots[None, :] * stride_kb + kv_head * stride_kh + offs_d[:, None],
                mask=mask_n[None, :] & mask_d[:, None],
                other=0.0,
            )
            qk = tl.dot(q, k.to(q.dtype), input_precision=DOT_PRECISION)
            qk = soft_cap_log2(qk, sm_scale * k_scale, logit_cap, HAS_CAP)
            visible = mask_n[None, :]
            if HAS_WINDOW:
                visible = visible & (pos[None, :] > prefix_len + offs_m[:, None] - window)
            qk = tl.where(visible, qk, float("-inf"))
            v = tl.load(
                V_Buffer + slots[:, None] * stride_vb + kv_head * stride_vh + offs_d[None, :],
                mask=mask_n[:, None] & mask_d[None, :],
                other=0.0,
            )
            v = (v.to(tl.float32) * v_scale).to(q.dtype)
            m_i, l_i, acc = online_softmax_step(qk, v, m_i, l_i, acc, DOT_PRECISION)

        # Pass 2: the new tokens, causal, contiguous in this pass's k/v.
        causal_end = tl.minimum((block_m + 1) * BLOCK_M, extend_len)
        new_start = 0
        if HAS_WINDOW:
            new_start = tl.maximum(block_m * BLOCK_M - window + 1, 0)
        for start_n in range(new_start, causal_end, BLOCK_N):
            pos = start_n + offs_n
            mask_n = pos < extend_len
            rows = token_start + pos
            k = tl.load(
                K_Extend + rows[None, :] * stride_ket + kv_head * stride_keh + offs_d[:, None],
                mask=mask_n[None, :] & mask_d[:, None],
                other=0.0,
            )
            qk = tl.dot(q, k.to(q.dtype), input_precision=DOT_PRECISION)
            qk = soft_cap_log2(qk, sm_scale, logit_cap, HAS_CAP)
            visible = mask_n[None, :] & (offs_m[:, None] >= pos[None, :])
            if HAS_WINDOW:
                visible = visible & (pos[None, :] > offs_m[:, None] - window)
            qk = tl.where(visible, qk, float("-inf"))
            v = tl.load(
                V_Extend + rows[:, None] * stride_vet + kv_head * stride_veh + offs_d[None, :],
                mask=mask_n[:, None] & mask_d[None, :],
                other=0.0,
            )
            m_i, l_i, acc = online_softmax_step(qk, v.to(q.dtype), m_i, l_i, acc, DOT_PRECISION)

        if HAS_SINKS:
            sink = sink_log2(Sinks, head, HAS_SINKS)
            top = tl.maximum(m_i, sink)
            alpha = tl.exp2(m_i - top)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha + tl.exp2(sink - top)
        tl.store(
            Out + (token_start + offs_m[:, None]) * stride_ot + head * stride_oh + offs_d[None, :],
            (acc / l_i[:, None]).to(Out.dtype.element_ty),
            mask=mask_m[:, None] & mask_d[None, :],
        )


def tile_config(head_dim: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages).

    On the H200 (scripts/gpu/ATTENTION_RESULTS.md), Llama-3-8B heads, bf16: 64x64 tiles with
    4 warps and 2 pipeline stages beat 128x64/8 warps/1 stage by 10-20% on every shape tried.
    """
    if head_dim > 128 or dtype == torch.float32:
        return 32, 32, 4, 1
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9:
        return 64, 64, 4, 2
    return 64, 64, 4, 1


def extend_attention_fwd(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_extend_len: int,
    sm_scale: float,
    tile: tuple[int, int, int, int] | None = None,
    sliding_window: int = -1,
    logit_cap: float = 0.0,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    sinks: torch.Tensor | None = None,
) -> None:
    """Causal attention of each request's new tokens over its prefix and themselves.

    q_extend, o_extend: [tokens, q_heads, head_dim]; k_extend, v_extend: [tokens, kv_heads,
    head_dim] (this pass's tokens, requests back to back from extend_start_loc);
    k_buffer, v_buffer: [slots, kv_heads, head_dim], read for the first prefix_lens[b] tokens.
    tile overrides tile_config (for tuning). A positive sliding_window W hides keys at W or
    more positions behind a query; a positive logit_cap soft-caps the scores; the buffers'
    values times k_scale / v_scale are the prefix's K / V (FP8 pools); `sinks` ([q_heads],
    natural-log logits) join each head's softmax denominator.
    """
    _, num_heads, head_dim = q_extend.shape
    num_kv_heads = k_extend.shape[1]
    bs = extend_lens.shape[0]
    block_m, block_n, num_warps, num_stages = tile or tile_config(head_dim, q_extend.dtype)
    grid = (bs, num_heads, triton.cdiv(max(max_extend_len, 1), block_m))
    _extend_kernel[grid](
        q_extend,
        k_extend,
        v_extend,
        o_extend,
        k_buffer,
        v_buffer,
        req_to_token,
        req_pool_indices,
        prefix_lens,
        extend_lens,
        extend_start_loc,
        sinks if sinks is not None else extend_lens,  # never read without sinks
        sm_scale,
        logit_cap,
        k_scale,
        v_scale,
        sliding_window,
        req_to_token.stride(0),
        q_extend.stride(0),
        q_extend.stride(1),
        k_extend.stride(0),
        k_extend.stride(1),
        v_extend.stride(0),
        v_extend.stride(1),
        o_extend.stride(0),
        o_extend.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        GROUP_SIZE=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        DOT_PRECISION=dot_precision(q_extend.dtype),
        HAS_CAP=logit_cap > 0,
        HAS_WINDOW=sliding_window > 0,
        HAS_SINKS=sinks is not None,
        num_warps=num_warps,
        num_stages=num_stages,
    )
