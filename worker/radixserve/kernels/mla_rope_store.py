"""MLA's per-token prologue in one Triton kernel: normalise the KV latent, rotate the shared
key part and every head's query rope part, and store the latent row in the pool.

What it replaces, per layer and pass, on the torch path (DeepseekMLA's CPU path, the reference
it is checked against): the latent's copy and RMSNorm, the two de-interleaving gathers and
concatenations, the rotary embedding's gathers, casts and concatenations for q and k, and the
pool's two index_put stores. At batch 1 those are a dozen kernels of a few microseconds each
in every layer, several times the latent attention itself.

One program per token. The rope part of a checkpoint is interleaved (pairs (x0, x1), ...) or
not; either way it is rotated as the rotate-half layout and written de-interleaved, in the
query and in the cached key alike, so every score is the reference's. The rotated query goes
to its own tensor (not over its input: the interleaved read and the de-interleaved write of
one program touch each other's addresses). A programmatic dependent of the kernel before (the
latent's projection): the token's position and slot (step inputs), the norm's weight and the
rotary tables (constants) are read before its wait.
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


@jit
def _mla_rope_store_kernel(
    Q,
    KV_A,
    Positions,
    Cos,
    Sin,
    Norm_weight,
    Pool,
    Loc,
    Q_rope_out,
    eps,
    num_heads,
    stride_qt,
    stride_qh,
    stride_kvt,
    stride_pool,
    stride_ot,
    stride_oh,
    stride_cos,
    NOPE: tl.constexpr,
    LATENT: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    PDL: tl.constexpr,
):
    t = tl.program_id(0)
    pos = tl.load(Positions + t).to(tl.int64)
    loc = tl.load(Loc + t).to(tl.int64)
    row = KV_A + t * stride_kvt
    dst = Pool + loc * stride_pool
    offs_c = tl.arange(0, BLOCK_C)
    mask_c = offs_c < LATENT
    weight = tl.load(Norm_weight + offs_c, mask=mask_c, other=0.0)
    offs_p = tl.arange(0, BLOCK_HALF)
    mask_p = offs_p < HALF
    cos = tl.load(Cos + pos * stride_cos + offs_p, mask=mask_p, other=0.0)
    sin = tl.load(Sin + pos * stride_cos + offs_p, mask=mask_p, other=0.0)
    wait_for_prior_kernel(PDL)

    # the latent: RMSNorm in float32, rounded, then scaled by the weight (the reference's order)
    x = tl.load(row + offs_c, mask=mask_c, other=0.0).to(tl.float32)
    normed = x * tl.rsqrt(tl.sum(x * x, 0) / LATENT + eps)
    latent = normed.to(weight.dtype) * weight
    tl.store(dst + offs_c, latent.to(Pool.dtype.element_ty), mask=mask_c)

    if INTERLEAVED:
        first, second = 2 * offs_p, 2 * offs_p + 1
    else:
        first, second = offs_p, HALF + offs_p

    # the shared key's rope part, rotated into the pool row after the latent
    k1 = tl.load(row + LATENT + first, mask=mask_p, other=0.0).to(tl.float32)
    k2 = tl.load(row + LATENT + second, mask=mask_p, other=0.0).to(tl.float32)
    out_ty = Pool.dtype.element_ty
    tl.store(dst + LATENT + offs_p, (k1 * cos - k2 * sin).to(out_ty), mask=mask_p)
    tl.store(dst + LATENT + HALF + offs_p, (k2 * cos + k1 * sin).to(out_ty), mask=mask_p)

    # every head's query rope part, rotated into its own tensor
    heads = tl.arange(0, BLOCK_H)
    mask = (heads < num_heads)[:, None] & mask_p[None, :]
    q_row = Q + t * stride_qt + heads[:, None] * stride_qh + NOPE
    q1 = tl.load(q_row + first[None, :], mask=mask, other=0.0).to(tl.float32)
    q2 = tl.load(q_row + second[None, :], mask=mask, other=0.0).to(tl.float32)
    o_row = Q_rope_out + t * stride_ot + heads[:, None] * stride_oh
    q_ty = Q_rope_out.dtype.element_ty
    tl.store(o_row + offs_p[None, :], (q1 * cos - q2 * sin).to(q_ty), mask=mask)
    tl.store(o_row + HALF + offs_p[None, :], (q2 * cos + q1 * sin).to(q_ty), mask=mask)


def mla_rope_store(
    q: torch.Tensor,
    kv_a: torch.Tensor,
    positions: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    pool: torch.Tensor,
    out_cache_loc: torch.Tensor,
    qk_nope: int,
    interleaved: bool,
) -> torch.Tensor:
    """q: [T, heads, qk_nope + rope] (its rope part is read); kv_a: [T, latent + rope] (the
    kv_a_proj_with_mqa output); cos/sin: [positions, rope / 2] float32; pool: the layer's
    latent buffer [slots, 1, latent + rope], written at out_cache_loc [T] with
    [norm(latent) * weight | rotated key]. Returns the rotated query rope parts
    [T, heads, rope], de-interleaved."""
    tokens, heads, width = q.shape
    rope = width - qk_nope
    latent = kv_a.shape[-1] - rope
    out = torch.empty((tokens, heads, rope), dtype=q.dtype, device=q.device)
    if tokens == 0:
        return out
    _mla_rope_store_kernel[(tokens,)](
        q,
        kv_a,
        positions,
        cos_cache,
        sin_cache,
        norm_weight,
        pool,
        out_cache_loc,
        out,
        eps,
        heads,
        q.stride(0),
        q.stride(1),
        kv_a.stride(0),
        pool.stride(0),
        out.stride(0),
        out.stride(1),
        cos_cache.stride(0),
        NOPE=qk_nope,
        LATENT=latent,
        HALF=rope // 2,
        BLOCK_C=triton.next_power_of_2(latent),
        BLOCK_HALF=triton.next_power_of_2(rope // 2),
        BLOCK_H=triton.next_power_of_2(heads),
        INTERLEAVED=interleaved,
        num_warps=4,
        **dependent_launch(q),
    )
    return out
