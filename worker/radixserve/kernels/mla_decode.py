"""MLA decode attention in Triton over the latent paged cache (DeepSeek V2/V3, absorbed form).

In decode the MLA layer folds W_UK into the query, so every head's query is
`[q_latent (kv_lora_rank) | q_rope (rope_dim)]` and attends to one shared key per token, the
pool's latent row `[latent | k_rope]`; the value is that row's latent part (W_UV is applied
after). That is multi-query attention with a key of 576 and a value of 512 values (V2/V3
sizes) that are the *same bytes*, shared by every head.

So the heads are the M dimension of both products: a stage-1 program holds BLOCK_H heads'
queries and, per tile of BLOCK_N tokens, reads the latent tile once and computes
q [BLOCK_H, 576] x tile^T -> scores [BLOCK_H, BLOCK_N], then P x tile[:, :512] -> out
[BLOCK_H, 512]. With 128 heads (V3) a 64-row head block puts each tile on the tensor cores'
64-row instruction (Hopper's wgmma, operands from shared memory) and reads each tile twice
in all instead of eight times; with 16 heads (V2-Lite) one block holds every head. At 128
heads the kernel is bound by compute as much as by memory: 2 x 128 x (576 + 512) FLOPs per
1,152 bytes is 242 FLOP/byte, above an H200's ~230 (989 dense bf16 TFLOPS over 4.3 TB/s).

Split-KV ("flash decoding"): the grid is (request, head block, split); each split covers a
contiguous piece of the request's tokens, cut by decode_attention's `_split_bounds`, and
decode_attention's stage 2 (`merge_splits`) merges the splits. The split count depends on the
batch and head counts only, and lengths, rows and slots are read on the device, so a captured
CUDA graph stays valid for any lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.kernels.triton_support import (
    dependent_launch,
    dot_precision,
    jit,
    tl,
    triton,
    wait_for_prior_kernel,
)

if triton is not None:  # decode_attention imports Triton itself; a CPU-only install lacks it
    from radixserve.kernels.decode_attention import (
        _MIN_SPLIT_TOKENS,  # stage 2 recomputes the splits' bounds with it
        _split_bounds,
        merge_splits,
    )

# Up to twice decode_attention's: with one head block (V2-Lite) a batch-1 request has only its
# splits to spread over the SMs. The merge's [128 splits, 128 values] float32 tile still fits
# its 4 warps' registers (149 a thread on sm_90, no spills).
_MAX_SPLITS = 128
_MERGE_BLOCK_D = 128
# Programs per SM the split count aims for, as decode_attention's: each tile is a chain of
# two dependent gathers (slot, then row), and the SMs need several programs to hide it.
_PROGRAMS_PER_SM = 4


@dataclass(frozen=True)
class MLADecodeConfig:
    """Stage 1's tile shape and launch: heads a program (a power of two, >= 16 for tl.dot),
    tokens a tile, warps and software-pipeline stages."""

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int


def default_config(num_heads: int, dtype: torch.dtype) -> MLADecodeConfig:
    """16 heads or fewer: one 16-row block (mma.sync; about 130 registers a thread on sm_90,
    no spills; 4 warps in bf16, as measured). More: 64-row blocks on 8 warps (wgmma, both operands of the scores' product in
    shared memory), each warp group holding half of the [64, 512] float32 accumulator (128
    registers a thread). Triton gives the scores' product all 8 warps along the rows (its rule
    for a dot that feeds another), so both warp groups compute the same [64, BLOCK_N] scores,
    each re-reading the query from shared memory per instruction: 64-token tiles make those
    instructions twice as wide as 32-token ones and halve that traffic, at the price of 216 KB
    of shared memory (two stages; the limit is 227 KB) and all 255 registers (Triton 3.6 spills
    32 bytes). float32 (the exactness reference) keeps the 16-row tile at any head count: the
    64-row one would need twice the shared memory there is. scripts/gpu/bench_mla.py times the
    alternatives beside these."""
    if num_heads <= 16 and dtype.itemsize <= 2:
        # 4 warps: 114.9 against 145.3 us at batch 8 and 934.5 against 1,326.8 at batch 64
        # (32k context, 16 heads, H200 2026-12-04, bench_mla.py's sweep)
        return MLADecodeConfig(block_h=16, block_n=32, num_warps=4, num_stages=2)
    if dtype.itemsize > 2:
        return MLADecodeConfig(block_h=16, block_n=32, num_warps=8, num_stages=2)
    return MLADecodeConfig(block_h=64, block_n=64, num_warps=8, num_stages=2)


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
    PDL: tl.constexpr,
):
    """One (request, head block, split): the split's tokens in tiles of BLOCK_N, each latent
    tile loaded once for the scores and the output of all BLOCK_H heads. Writes the split's
    normalised output and its base-2 log-sum-exp (nothing for an empty split: stage 2 merges
    only the splits the request's length fills). A programmatic dependent of the kernel
    before (the W_UK product): the length and the first tile's slots, step inputs, are read
    before its wait, as decode_attention's split kernel does."""
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
    start, end = _split_bounds(0, seq_len, split_id, num_kv_splits, MIN_SPLIT)
    offs_n = start + tl.arange(0, BLOCK_N)
    slots = tl.load(slot_row + offs_n, mask=offs_n < end, other=0)
    wait_for_prior_kernel(PDL)
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
            c = c.to(q_c.dtype)
            qk = tl.dot(q_c, tl.trans(c), input_precision=DOT_PRECISION)
            qk = tl.dot(q_r, tl.trans(r.to(q_r.dtype)), qk, input_precision=DOT_PRECISION)
            qk = tl.where(mask_n[None, :], qk * sm_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = tl.dot(p.to(q_c.dtype), c, acc * alpha[:, None], input_precision=DOT_PRECISION)
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


def num_splits(batch_size: int, num_heads: int, num_sms: int, block_h: int) -> int:
    """Splits per request: enough (request, head block, split) programs for a few a SM (at
    batch 1 the splits alone must fill the GPU). A function of the batch and head counts,
    never of the lengths, so a captured graph stays valid for any lengths."""
    programs = max(1, batch_size * triton.cdiv(num_heads, block_h))
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
    config: MLADecodeConfig | None = None,
) -> torch.Tensor:
    """out[b, h] = softmax(q[b, h] . KV[b]^T * sm_scale) KV[b, :, :kv_lora_rank] over the
    first seq_lens[b] tokens of request b's slots (req_to_token[req_pool_indices[b]]), where
    q = [q_latent | q_rope] is the absorbed query.

    q_latent: [bs, heads, kv_lora_rank], q_rope: [bs, heads, rope_dim], any strides with a
    unit last one (the W_UK product and the rotary kernel's output, never concatenated);
    kv_buffer: the layer's latent pool [slots, 1, kv_lora_rank + rope_dim]. Returns
    [bs, heads, kv_lora_rank] in q's dtype, a view of a head-major [heads, bs, kv_lora_rank]
    tensor (what the W_UV product takes as it is). Every seq_len must be >= 1. `config`
    overrides `default_config` (the benchmark's alternatives)."""
    bs, num_heads, kv_lora_rank = q_latent.shape
    rope = q_rope.shape[-1]
    device = q_latent.device
    config = config or default_config(num_heads, q_latent.dtype)
    splits = num_splits(bs, num_heads, num_sms, config.block_h)
    mid_o = torch.empty((bs, num_heads, splits, kv_lora_rank), dtype=torch.float32, device=device)
    mid_lse = torch.empty((bs, num_heads, splits), dtype=torch.float32, device=device)
    out = torch.empty((num_heads, bs, kv_lora_rank), dtype=q_latent.dtype, device=device)
    out = out.transpose(0, 1)
    block_c = triton.next_power_of_2(kv_lora_rank)
    _mla_decode_split_kernel[(bs, triton.cdiv(num_heads, config.block_h), splits)](
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
        BLOCK_H=config.block_h,
        BLOCK_N=config.block_n,
        MIN_SPLIT=_MIN_SPLIT_TOKENS,
        DOT_PRECISION=dot_precision(q_latent.dtype),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **dependent_launch(q_latent),
    )
    merge_splits(mid_o, mid_lse, out, seq_lens, splits, min(_MERGE_BLOCK_D, block_c))
    return out
