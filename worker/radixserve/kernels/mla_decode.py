"""MLA decode attention in Triton over the latent paged cache (DeepSeek V2/V3, absorbed form).

In decode the MLA layer folds W_UK into the query, so every head's query is
`[q_latent (kv_lora_rank) | q_rope (rope_dim)]` and attends to one shared key per token, the
pool's latent row `[latent | k_rope]`; the value is that row's latent part (W_UV is applied
after). That is multi-query attention with a key of 576 and a value of 512 values (V2/V3
sizes) that are the *same bytes*: this kernel loads each latent tile once and uses it for the
scores and for the output, which is where MLA's bandwidth saving comes from (a generic
K/V kernel would read the latent twice).

Split-KV like kernels/decode_attention.py: stage 1 runs one program per (request, block of
heads, split) and writes a partial output and its base-2 log-sum-exp; stage 2 merges the
splits. The split count depends on the batch size only, and lengths, rows and slots are read
on the device, so a captured CUDA graph stays valid for any lengths.
"""

from __future__ import annotations

import torch

from radixserve.kernels.triton_support import dot_precision, jit, tl, triton

_BLOCK_N = 32
_BLOCK_H = 16
_MIN_SPLIT_TOKENS = 64
_MAX_SPLITS = 128
_PROGRAMS_PER_SM = 4


@jit
def _mla_split_bounds(seq_len, split_id, num_kv_splits, MIN_SPLIT: tl.constexpr):
    split_len = tl.cdiv(tl.cdiv(seq_len, num_kv_splits), MIN_SPLIT) * MIN_SPLIT
    start = split_len * split_id
    return start, tl.minimum(start + split_len, seq_len)


@jit
def _mla_decode_split_kernel(
    Q_latent,
    Q_rope,
    KV,
    Req_to_token,
    Req_pool_indices,
    Seq_lens,
    Mid_O,
    Mid_Lse,
    sm_scale,
    num_heads,
    num_kv_splits,
    stride_r2t,
    stride_qcb,
    stride_qch,
    stride_qrb,
    stride_qrh,
    stride_kv,
    stride_mob,
    stride_moh,
    stride_mos,
    stride_mlb,
    stride_mlh,
    LATENT: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MIN_SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    batch = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    split_id = tl.program_id(2)
    mask_h = heads < num_heads
    offs_c = tl.arange(0, BLOCK_C)
    mask_c = offs_c < LATENT
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < ROPE

    seq_len = tl.load(Seq_lens + batch).to(tl.int32)
    slot_row = Req_to_token + tl.load(Req_pool_indices + batch).to(tl.int64) * stride_r2t
    start, end = _mla_split_bounds(seq_len, split_id, num_kv_splits, MIN_SPLIT)
    offs_n = start + tl.arange(0, BLOCK_N)
    slots = tl.load(slot_row + offs_n, mask=offs_n < end, other=0)
    if end > start:
        q_c = tl.load(
            Q_latent + batch * stride_qcb + heads[:, None] * stride_qch + offs_c[None, :],
            mask=mask_h[:, None] & mask_c[None, :],
            other=0.0,
        )
        q_r = tl.load(
            Q_rope + batch * stride_qrb + heads[:, None] * stride_qrh + offs_r[None, :],
            mask=mask_h[:, None] & mask_r[None, :],
            other=0.0,
        )
        m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)
        for start_n in range(start, end, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            mask_n = offs_n < end
            rows = KV + slots.to(tl.int64)[:, None] * stride_kv
            # the next tile's slots, asked for before this tile's latents are used: the two
            # dependent loads of a tile (slot, then row) overlap with the tile before
            slots = tl.load(slot_row + offs_n + BLOCK_N, mask=offs_n + BLOCK_N < end, other=0)
            # the latent tile: the keys' first LATENT columns and the values, read once
            c = tl.load(rows + offs_c[None, :], mask=mask_n[:, None] & mask_c[None, :], other=0.0)
            r = tl.load(
                rows + LATENT + offs_r[None, :], mask=mask_n[:, None] & mask_r[None, :], other=0.0
            )
            qk = tl.dot(q_c, tl.trans(c.to(q_c.dtype)), input_precision=DOT_PRECISION)
            qk += tl.dot(q_r, tl.trans(r.to(q_r.dtype)), input_precision=DOT_PRECISION)
            qk = tl.where(mask_n[None, :], qk * sm_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(
                p.to(q_c.dtype), c.to(q_c.dtype), input_precision=DOT_PRECISION
            )
            m_i = m_new
        tl.store(
            Mid_O
            + batch * stride_mob
            + heads[:, None] * stride_moh
            + split_id * stride_mos
            + offs_c[None, :],
            acc / l_i[:, None],
            mask=mask_h[:, None] & mask_c[None, :],
        )
        tl.store(
            Mid_Lse + batch * stride_mlb + heads * stride_mlh + split_id,
            m_i + tl.log2(l_i),
            mask=mask_h,
        )


@jit
def _mla_merge_kernel(
    Mid_O,
    Mid_Lse,
    Out,
    Seq_lens,
    num_kv_splits,
    stride_mob,
    stride_moh,
    stride_mos,
    stride_mlb,
    stride_mlh,
    stride_ob,
    stride_oh,
    LATENT: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_S: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
    MIN_SPLIT: tl.constexpr,
):
    """One (request, head): its filled splits (those with keys) merged by their weights,
    SPLIT_CHUNK splits a tile: a loop split by split would be a chain of one memory latency
    each (64 of them at batch 1), and all 128 splits of LATENT floats do not fit in registers."""
    batch = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(Seq_lens + batch).to(tl.int32)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_kv_splits), MIN_SPLIT) * MIN_SPLIT
    filled = tl.cdiv(seq_len, split_len)
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < filled
    offs_c = tl.arange(0, BLOCK_C)
    mask_c = offs_c < LATENT
    lse_row = Mid_Lse + batch * stride_mlb + head * stride_mlh
    top = tl.max(tl.load(lse_row + offs_s, mask=mask_s, other=float("-inf")), 0)
    out_row = Mid_O + batch * stride_mob + head * stride_moh
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    total = tl.sum(tl.zeros([SPLIT_CHUNK], dtype=tl.float32), 0)
    for first in range(0, filled, SPLIT_CHUNK):
        chunk = first + tl.arange(0, SPLIT_CHUNK)
        in_chunk = chunk < filled
        weights = tl.exp2(tl.load(lse_row + chunk, mask=in_chunk, other=float("-inf")) - top)
        parts = tl.load(
            out_row + chunk[:, None] * stride_mos + offs_c[None, :],
            mask=in_chunk[:, None] & mask_c[None, :],
            other=0.0,
        )
        acc += tl.sum(parts * weights[:, None], 0)
        total += tl.sum(weights, 0)
    out = acc / total
    tl.store(
        Out + batch * stride_ob + head * stride_oh + offs_c,
        out.to(Out.dtype.element_ty),
        mask=mask_c,
    )


def num_splits(batch_size: int, num_heads: int, num_sms: int) -> int:
    """Splits per request: a few (request, head block, split) programs per SM, as many as a
    long context at batch 1 needs to draw the whole bandwidth (one latent head block leaves
    only the splits to fill the SMs); a function of the batch size only, so a captured graph
    stays valid."""
    programs = max(1, batch_size * triton.cdiv(num_heads, _BLOCK_H))
    return max(1, min(_MAX_SPLITS, triton.cdiv(_PROGRAMS_PER_SM * num_sms, programs)))


def mla_decode_fwd(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    kv_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    num_sms: int,
) -> torch.Tensor:
    """out[b, h] = softmax(q[b, h] . KV[b]^T * sm_scale) KV[b, :, :kv_lora_rank] over the
    first seq_lens[b] tokens of request b's slots (req_to_token[req_pool_indices[b]]), where
    q = [q_latent | q_rope] is the absorbed query.

    q_latent: [bs, heads, kv_lora_rank], q_rope: [bs, heads, rope_dim], any strides with a
    unit last one (the W_UK product and the rotary kernel's output, never concatenated);
    kv_buffer: the layer's latent pool [slots, 1, kv_lora_rank + rope_dim]. Returns
    [bs, heads, kv_lora_rank] in q's dtype, a view of a head-major [heads, bs, kv_lora_rank]
    tensor (what the W_UV product takes as it is). Every seq_len must be >= 1."""
    bs, num_heads, kv_lora_rank = q_latent.shape
    rope = q_rope.shape[-1]
    device = q_latent.device
    splits = num_splits(bs, num_heads, num_sms)
    mid_o = torch.empty((bs, num_heads, splits, kv_lora_rank), dtype=torch.float32, device=device)
    mid_lse = torch.empty((bs, num_heads, splits), dtype=torch.float32, device=device)
    out = torch.empty((num_heads, bs, kv_lora_rank), dtype=q_latent.dtype, device=device)
    out = out.transpose(0, 1)
    block_c = triton.next_power_of_2(kv_lora_rank)
    _mla_decode_split_kernel[(bs, triton.cdiv(num_heads, _BLOCK_H), splits)](
        q_latent,
        q_rope,
        kv_buffer,
        req_to_token,
        req_pool_indices,
        seq_lens,
        mid_o,
        mid_lse,
        sm_scale * 1.4426950408889634,
        num_heads,
        splits,
        req_to_token.stride(0),
        q_latent.stride(0),
        q_latent.stride(1),
        q_rope.stride(0),
        q_rope.stride(1),
        kv_buffer.stride(0),
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
        LATENT=kv_lora_rank,
        ROPE=rope,
        BLOCK_C=block_c,
        BLOCK_R=max(16, triton.next_power_of_2(rope)),
        BLOCK_H=_BLOCK_H,
        BLOCK_N=_BLOCK_N,
        MIN_SPLIT=_MIN_SPLIT_TOKENS,
        DOT_PRECISION=dot_precision(q_latent.dtype),
        num_warps=4 if block_c <= 256 else 8,
        num_stages=2,
    )
    _mla_merge_kernel[(bs, num_heads)](
        mid_o,
        mid_lse,
        out,
        seq_lens,
        splits,
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
        out.stride(0),
        out.stride(1),
        LATENT=kv_lora_rank,
        BLOCK_C=block_c,
        BLOCK_S=triton.next_power_of_2(splits),
        SPLIT_CHUNK=min(16, triton.next_power_of_2(splits)),
        MIN_SPLIT=_MIN_SPLIT_TOKENS,
        num_warps=8 if block_c >= 512 else 4,
    )
    return out
