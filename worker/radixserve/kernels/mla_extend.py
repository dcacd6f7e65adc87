"""MLA extend (prefill) attention in Triton, expanded form (DeepSeek V2/V3).

In prefill the MLA layer expands each request's latents, its cached prefix included, into
per-head keys and values with kv_b_proj (layers/mla.py): key = [k_nope (per head) | k_rope
(one per token, shared by every head)], value = v (per head, narrower than the key: 128
against 192 at V2/V3's sizes). The expanded form does fewer FLOPs than the absorbed one where
queries are many (prefill is compute-bound), and the requests' expansions are packed back to
back, so one launch covers every request of a pass.

One program takes BLOCK_M new tokens of one request and one head and walks that request's
packed keys once, 0 .. prefix + its last query, with one online softmax: a query at position
prefix + j sees keys 0 .. prefix + j (the causal mask aligned to the bottom right). The
scores are two products, q_nope . k_nope and q_rope . k_rope, so neither the shared rope key
is copied per head nor the value padded to the key's width (which FlashAttention's one head
size asks for).
"""

from __future__ import annotations

import torch

from radixserve.kernels.triton_support import dot_precision, jit, tl, triton

if triton is not None:  # extend_attention imports Triton itself; a CPU-only install lacks it
    from radixserve.kernels.decode_attention import soft_cap_log2
    from radixserve.kernels.extend_attention import online_softmax_step


@jit
def _mla_extend_kernel(
    Q,
    K_nope,
    K_rope,
    V,
    Out,
    Kv_start,
    Prefix_lens,
    Extend_lens,
    Q_start,
    sm_scale,
    stride_qt,
    stride_qh,
    stride_knt,
    stride_knh,
    stride_krt,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    D_NOPE: tl.constexpr,
    D_ROPE: tl.constexpr,
    D_V: tl.constexpr,
    BLOCK_NOPE: tl.constexpr,
    BLOCK_ROPE: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    block_m = tl.program_id(2)

    extend_len = tl.load(Extend_lens + req).to(tl.int32)
    if block_m * BLOCK_M < extend_len:
        prefix_len = tl.load(Prefix_lens + req).to(tl.int32)
        kv_start = tl.load(Kv_start + req).to(tl.int64)
        q_start = tl.load(Q_start + req).to(tl.int64)

        offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query index within the extend
        mask_m = offs_m < extend_len
        offs_dn = tl.arange(0, BLOCK_NOPE)
        offs_dr = tl.arange(0, BLOCK_ROPE)
        offs_dv = tl.arange(0, BLOCK_V)
        offs_n = tl.arange(0, BLOCK_N)
        q_rows = Q + (q_start + offs_m[:, None]) * stride_qt + head * stride_qh
        q_nope = tl.load(
            q_rows + offs_dn[None, :],
            mask=mask_m[:, None] & (offs_dn[None, :] < D_NOPE),
            other=0.0,
        )
        q_rope = tl.load(
            q_rows + D_NOPE + offs_dr[None, :],
            mask=mask_m[:, None] & (offs_dr[None, :] < D_ROPE),
            other=0.0,
        )
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_V], dtype=tl.float32)

        # keys 0 .. prefix + the tile's last query; the last tiles are cut by the causal mask
        kv_end = prefix_len + tl.minimum((block_m + 1) * BLOCK_M, extend_len)
        for start_n in range(0, kv_end, BLOCK_N):
            pos = start_n + offs_n
            mask_n = pos < kv_end
            rows = kv_start + pos
            k_nope = tl.load(
                K_nope + rows[None, :] * stride_knt + head * stride_knh + offs_dn[:, None],
                mask=mask_n[None, :] & (offs_dn[:, None] < D_NOPE),
                other=0.0,
            )
            k_rope = tl.load(
                K_rope + rows[None, :] * stride_krt + offs_dr[:, None],
                mask=mask_n[None, :] & (offs_dr[:, None] < D_ROPE),
                other=0.0,
            )
            qk = tl.dot(q_nope, k_nope, input_precision=DOT_PRECISION)
            qk = tl.dot(q_rope, k_rope, acc=qk, input_precision=DOT_PRECISION)
            qk = soft_cap_log2(qk, sm_scale, 0.0, False)
            visible = mask_n[None, :] & (pos[None, :] <= prefix_len + offs_m[:, None])
            qk = tl.where(visible, qk, float("-inf"))
            v = tl.load(
                V + rows[:, None] * stride_vt + head * stride_vh + offs_dv[None, :],
                mask=mask_n[:, None] & (offs_dv[None, :] < D_V),
                other=0.0,
            )
            m_i, l_i, acc = online_softmax_step(qk, v, m_i, l_i, acc, DOT_PRECISION)

        tl.store(
            Out + (q_start + offs_m[:, None]) * stride_ot + head * stride_oh + offs_dv[None, :],
            (acc / l_i[:, None]).to(Out.dtype.element_ty),
            mask=mask_m[:, None] & (offs_dv[None, :] < D_V),
        )


def tile_config(dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages): extend_attention's tiles for 16-bit values
    (the key here is 128 + 64 wide, its tile in two parts that each fit the 64x64 shape's
    shared memory twice over); float32, the exactness reference, 32x32 in one stage."""
    if dtype.itemsize > 2:
        return 32, 32, 4, 1
    return 64, 64, 4, 2


def _block(width: int) -> int:
    return max(16, triton.next_power_of_2(width))  # tl.dot's smallest side


def mla_extend_attention(
    q: torch.Tensor,
    k_nope: torch.Tensor,
    k_rope: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    kv_start: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    q_start: torch.Tensor,
    max_extend_len: int,
    sm_scale: float,
) -> None:
    """Causal attention of each request's new tokens over its expanded keys and values.

    q: [tokens, heads, d_nope + d_rope] (the pass's new tokens, request b's from q_start[b]);
    out: [tokens, heads, d_v], written at the same rows. k_nope: [keys, heads, d_nope],
    k_rope: [keys, d_rope], v: [keys, heads, d_v]: request b's prefix_lens[b] +
    extend_lens[b] keys packed from kv_start[b], its prefix first. Last dims contiguous.
    """
    heads, d_nope, d_v = k_nope.shape[1], k_nope.shape[2], v.shape[2]
    d_rope = k_rope.shape[1]
    block_m, block_n, num_warps, num_stages = tile_config(q.dtype)
    grid = (extend_lens.shape[0], heads, triton.cdiv(max(max_extend_len, 1), block_m))
    _mla_extend_kernel[grid](
        q,
        k_nope,
        k_rope,
        v,
        out,
        kv_start,
        prefix_lens,
        extend_lens,
        q_start,
        sm_scale,
        q.stride(0),
        q.stride(1),
        k_nope.stride(0),
        k_nope.stride(1),
        k_rope.stride(0),
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        D_NOPE=d_nope,
        D_ROPE=d_rope,
        D_V=d_v,
        BLOCK_NOPE=_block(d_nope),
        BLOCK_ROPE=_block(d_rope),
        BLOCK_V=_block(d_v),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=num_warps,
        num_stages=num_stages,
    )
