"""Fused elementwise kernels for the CUDA path: RMSNorm (with the residual add; Gemma's
(1 + w) form too), SiLU- or GELU-and-mul, rotary + KV store (FP8 caches included), and the scatter of a decode step's KV slots into req_to_token, one Triton
launch each.

A batch-1 decode step of an 8B model is ~600 small torch kernels besides its GEMMs (RMSNorm
alone is six), and their launches cost nearly as much as the GEMMs. Each wrapper here is one
launch, allocates nothing but its output, never reads device memory on the host, so it runs
unchanged inside CUDA graph capture.

The numerics follow the Hugging Face reference the torch paths implement (layernorm.py,
activation.py, rotary_embedding.py): RMSNorm normalises in float32, rounds to the input dtype,
then scales by the weight and rounds again, exactly as the reference does; SiLU-and-mul and
rotary compute in float32 and round once (the reference rounds after every op in half
precision, so those two agree with it to rounding, and exactly in float32 up to FMA).

Without Triton this module still imports (the torch paths never call in here): see
`triton_support`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from radixserve.kernels.triton_support import (
    dependent_launch,
    jit,
    tl,
    triton,
    wait_for_prior_kernel,
)

# Elements one program holds: enough work per program to stream memory at full bandwidth,
# few enough registers per thread to keep several programs resident per SM.
_TILE = 2048
# Up to this many tokens, rotary gives each (token, head) its own program: a decode step is
# latency-bound, and spreading it over many SMs beats a few programs looping over heads.
_ROTARY_SPREAD_MAX_TOKENS = 64


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _warps(elements: int, per_thread: int, most: int) -> int:
    """Warps giving each thread about `per_thread` of a program's `elements`."""
    return max(1, min(most, elements // (32 * per_thread)))


# n_rows follows the token count of a prefill: not specialised on, or a new kind of count
# (1, a multiple of 16) would compile a variant in the middle of serving
@jit(do_not_specialize=["n_rows"])
def _rms_norm_kernel(
    X,
    R,
    W,
    Out,
    n_rows,
    inner,
    n_cols,
    stride_xa,
    stride_xb,
    stride_ra,
    stride_rb,
    stride_oa,
    stride_ob,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    UNIT_OFFSET: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    """BLOCK_M rows of a [rows = A * inner, n_cols] view; row r sits at (r // inner) * stride_a
    + (r % inner) * stride_b, which covers per-head views of a fused qkv row.

    UNIT_OFFSET: Gemma's norm, x_normed * (1 + w) all in float32 and rounded once."""
    cols = tl.arange(0, BLOCK_N)
    # the weight is a constant: read before the wait, it is here when the activations are
    w = tl.load(W + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    wait_for_prior_kernel(PDL)
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    outer, head = rows // inner, rows % inner
    x_ptrs = X + (outer * stride_xa + head * stride_xb)[:, None] + cols[None, :]
    x = tl.load(x_ptrs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # the sum is rounded to the activation dtype before the norm, as in the reference
        r_ptrs = R + (outer * stride_ra + head * stride_rb)[:, None] + cols[None, :]
        x = (x.to(tl.float32) + tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)).to(
            R.dtype.element_ty
        )
        tl.store(r_ptrs, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, axis=1) / n_cols + eps)
    if UNIT_OFFSET:
        normed = xf * inv_rms[:, None]
        w = 1.0 + w
    else:
        normed = (xf * inv_rms[:, None]).to(x.dtype).to(tl.float32)
    o_ptrs = Out + (outer * stride_oa + head * stride_ob)[:, None] + cols[None, :]
    tl.store(o_ptrs, (normed * w[None, :]).to(Out.dtype.element_ty), mask=mask)


@jit
def gelu_tanh(x):
    """GELU, tanh approximation (`gelu_pytorch_tanh`): x * sigmoid(2 * sqrt(2 / pi) * (x +
    0.044715 x^3)), which is 0.5 x (1 + tanh(...)) without a tanh primitive."""
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return x / (1.0 + tl.exp(-2.0 * inner))


@jit
def _act_and_mul_kernel(
    GateUp, Out, d, stride_g, stride_o, GELU: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    wait_for_prior_kernel(PDL)
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(GateUp + token * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(GateUp + token * stride_g + d + cols, mask=mask, other=0.0).to(tl.float32)
    if GELU:
        out = gelu_tanh(gate) * up
    else:
        out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(Out + token * stride_o + cols, out.to(Out.dtype.element_ty), mask=mask)


@jit
def _rotary_store_kv_kernel(
    Positions,
    QKV,
    Cos,
    Sin,
    K_Cache,
    V_Cache,
    Loc,
    Q_Norm,
    K_Norm,
    num_heads,
    num_kv_heads,
    k_inv_scale,
    v_inv_scale,
    norm_eps,
    stride_pos,
    stride_qkv,
    stride_cos,
    stride_sin,
    stride_kb,
    stride_kh,
    stride_vb,
    stride_vh,
    stride_loc,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    FP8_CACHE: tl.constexpr,
    QK_NORM: tl.constexpr,
    UNIT_OFFSET: tl.constexpr,
    PDL: tl.constexpr,
):
    """One token, BLOCK_H of its heads in q | k | v order (all head_dim wide and adjacent in
    the qkv row): q and k heads are rotated in place, k and v heads are copied to the cache
    (an FP8 cache gets value / scale, saturated to the type's range). With QK_NORM, each q and
    k head is first RMS-normalized over its head_dim with Q_Norm's or K_Norm's weight (Qwen3's
    and Gemma 3's q/k norm; UNIT_OFFSET: Gemma's (1 + w)), rounded as `_rms_norm_kernel` stores
    it: the two norm launches of a layer become part of this one."""
    token = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    i = tl.arange(0, BLOCK_HALF)
    in_half = i < HALF
    # Read before the wait (see `wait_for_prior_kernel`): the positions and KV slots are the
    # step's inputs, cos and sin constants.
    pos = tl.load(Positions + token * stride_pos)
    loc = tl.load(Loc + token * stride_loc)
    cos = tl.load(Cos + pos * stride_cos + i, mask=in_half, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(Sin + pos * stride_sin + i, mask=in_half, other=0.0).to(tl.float32)[None, :]
    if QK_NORM:  # the norms' weights are constants too
        is_q = (heads < num_heads)[:, None]
        q_w1 = tl.load(Q_Norm + i, mask=in_half, other=0.0).to(tl.float32)[None, :]
        q_w2 = tl.load(Q_Norm + HALF + i, mask=in_half, other=0.0).to(tl.float32)[None, :]
        k_w1 = tl.load(K_Norm + i, mask=in_half, other=0.0).to(tl.float32)[None, :]
        k_w2 = tl.load(K_Norm + HALF + i, mask=in_half, other=0.0).to(tl.float32)[None, :]
        w1 = tl.where(is_q, q_w1, k_w1)
        w2 = tl.where(is_q, q_w2, k_w2)
    wait_for_prior_kernel(PDL, LAUNCH_NEXT_FIRST=True)

    rotated_heads = num_heads + num_kv_heads
    rotated = (heads < rotated_heads)[:, None]
    exists = (heads < rotated_heads + num_kv_heads)[:, None] & in_half[None, :]
    lo_ptrs = QKV + token * stride_qkv + heads[:, None] * (2 * HALF) + i[None, :]
    x1 = tl.load(lo_ptrs, mask=exists, other=0.0)
    x2 = tl.load(lo_ptrs + HALF, mask=exists, other=0.0)
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    if QK_NORM:
        inv_rms = tl.rsqrt(
            (tl.sum(x1f * x1f, axis=1) + tl.sum(x2f * x2f, axis=1)) / (2 * HALF) + norm_eps
        )
        n1, n2 = x1f * inv_rms[:, None], x2f * inv_rms[:, None]
        if UNIT_OFFSET:
            n1, n2 = n1 * (1.0 + w1), n2 * (1.0 + w2)
        else:
            n1 = n1.to(x1.dtype).to(tl.float32) * w1
            n2 = n2.to(x1.dtype).to(tl.float32) * w2
        x1f = tl.where(rotated, n1.to(x1.dtype).to(tl.float32), x1f)
        x2f = tl.where(rotated, n2.to(x1.dtype).to(tl.float32), x2f)
    # v heads pass through unchanged
    o1 = tl.where(rotated, x1f * cos - x2f * sin, x1f).to(x1.dtype)
    o2 = tl.where(rotated, x2f * cos + x1f * sin, x2f).to(x1.dtype)
    tl.store(lo_ptrs, o1, mask=exists & rotated)
    tl.store(lo_ptrs + HALF, o2, mask=exists & rotated)

    is_k = exists & rotated & (heads >= num_heads)[:, None]
    is_v = exists & (heads >= rotated_heads)[:, None]
    c1, c2 = o1, o2
    if FP8_CACHE:
        inv = tl.where(heads >= rotated_heads, v_inv_scale, k_inv_scale)[:, None]
        c1 = tl.clamp(o1.to(tl.float32) * inv, -448.0, 448.0)  # float8_e4m3fn's range
        c2 = tl.clamp(o2.to(tl.float32) * inv, -448.0, 448.0)  # float8_e4m3fn's range
    k_ptrs = K_Cache + loc * stride_kb + (heads - num_heads)[:, None] * stride_kh + i[None, :]
    tl.store(k_ptrs, c1.to(K_Cache.dtype.element_ty), mask=is_k)
    tl.store(k_ptrs + HALF, c2.to(K_Cache.dtype.element_ty), mask=is_k)
    v_ptrs = V_Cache + loc * stride_vb + (heads - rotated_heads)[:, None] * stride_vh + i[None, :]
    tl.store(v_ptrs, c1.to(V_Cache.dtype.element_ty), mask=is_v)
    tl.store(v_ptrs + HALF, c2.to(V_Cache.dtype.element_ty), mask=is_v)


@jit
def _norm_project_row_kernel(
    X,
    R,
    W,
    P,
    Bias,
    Slot,
    Normed,
    ResidualOut,
    Out,
    K,
    stride_ps,
    stride_pr,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    UNIT_OFFSET: tl.constexpr,
    HAS_SLOT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """One row's RMSNorm (after the residual add, as `_rms_norm_kernel` computes it) and a small
    projection of the normed row, in one launch: program r normalizes the whole row (its sum of
    squares is the row's, so every program takes all of it: K values from L2) and stores
    Out[r] = normed . P[r] (+ Bias[r]), summed in float32 and rounded once to Out's dtype;
    program 0 also stores the normed row and the sum into `Normed` and `ResidualOut` (new
    buffers: the other programs still read X and R). HAS_SLOT: P is stacked [slots, rows, K]
    and the row's slot (a step input) picks it, -1 none (a LoRA shrink of a base row: zeros).
    P's row, the bias and the norm's weight are constants and the slot a step input: read
    before the wait, and the kernel after launches first."""
    r = tl.program_id(0)
    ks = tl.arange(0, BLOCK_K)
    k_ok = ks < K
    on = k_ok
    p_row = P + r * stride_pr
    if HAS_SLOT:
        slot = tl.load(Slot).to(tl.int64)
        on = k_ok & (ks * 0 + slot >= 0)  # (vector-shaped: the interpreter's masks)
        p_row += tl.maximum(slot, 0) * stride_ps
    p = tl.load(p_row + ks, mask=on, other=0.0)
    w = tl.load(W + ks, mask=k_ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(Bias + r).to(tl.float32)
    wait_for_prior_kernel(PDL, LAUNCH_NEXT_FIRST=True)
    x = tl.load(X + ks, mask=k_ok, other=0.0)
    if HAS_RESIDUAL:
        # the sum rounded to the activation dtype before the norm, as in the reference
        x = (x.to(tl.float32) + tl.load(R + ks, mask=k_ok, other=0.0).to(tl.float32)).to(
            R.dtype.element_ty
        )
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, axis=0) / K + eps)
    if UNIT_OFFSET:
        normed = xf * inv_rms
        w = 1.0 + w
    else:
        normed = (xf * inv_rms).to(x.dtype).to(tl.float32)
    y = (normed * w).to(Normed.dtype.element_ty)
    if r == 0:
        tl.store(Normed + ks, y, mask=k_ok)
        if HAS_RESIDUAL:
            tl.store(ResidualOut + ks, x, mask=k_ok)
    out = tl.sum(p.to(tl.float32) * y.to(tl.float32), axis=0)
    if HAS_BIAS:
        out += bias
    tl.store(Out + r, out.to(Out.dtype.element_ty))


# Called eagerly once per decode step with a batch size that keeps changing: no specialisation
# on the count or on the index tensors' alignment (views of the packed inputs at offsets that
# follow the batch size), or each new kind of size would compile a variant mid-serving.
@jit(do_not_specialize=["n"], do_not_specialize_on_alignment=["Rows", "Cols", "Values"])
def _store_cells_kernel(Table, stride_t, Rows, Cols, Values, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    row = tl.load(Rows + i, mask=mask, other=0).to(tl.int64)
    col = tl.load(Cols + i, mask=mask, other=0)
    value = tl.load(Values + i, mask=mask, other=0)
    tl.store(Table + row * stride_t + col, value.to(Table.dtype.element_ty), mask=mask)


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    """x as an [A, B, n] view (no copy): rows are its leading indices, last axis unit-stride."""
    if x.stride(-1) != 1:
        raise ValueError(f"the normalised axis must be unit-stride, got strides {x.stride()}")
    if x.dim() == 1:
        return x.view(1, 1, -1)
    if x.dim() == 2:
        return x.unsqueeze(1)
    return x.view(-1, *x.shape[-2:])


def _launch_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor,
    unit_offset: bool = False,
) -> None:
    x3, o3 = _as_rows(x), _as_rows(out)
    r3 = _as_rows(residual) if residual is not None else x3
    n_rows, n_cols = x3.shape[0] * x3.shape[1], x3.shape[2]
    block_n = _pow2(n_cols)
    block_m = min(max(1, _TILE // block_n), _pow2(n_rows))
    _rms_norm_kernel[(triton.cdiv(n_rows, block_m),)](
        x3,
        r3,
        weight,
        o3,
        n_rows,
        x3.shape[1],
        n_cols,
        x3.stride(0),
        x3.stride(1),
        r3.stride(0),
        r3.stride(1),
        o3.stride(0),
        o3.stride(1),
        eps,
        HAS_RESIDUAL=residual is not None,
        UNIT_OFFSET=unit_offset,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=_warps(block_m * block_n, 16, 16),
        **dependent_launch(x),
    )


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    unit_offset: bool = False,
) -> torch.Tensor:
    """RMSNorm over the last axis of x, whose leading axes may be strided (e.g. [T, heads,
    head_dim] views of a qkv buffer). `out` may be x itself (in place).
    `unit_offset`: Gemma's (1 + weight) scale."""
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch_rms_norm(x, None, weight, eps, out, unit_offset)
    return out


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    unit_offset: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """In place: residual <- x + residual, x <- rms_norm(residual); returns (x, residual).

    One pass over the residual stream instead of an add, a copy and the norm's six kernels."""
    _launch_rms_norm(x, residual, weight, eps, x, unit_offset)
    return x, residual


# The largest projection `norm_project_row` takes: every program normalizes the whole row
# again, which pays only for a few programs (a LoRA shrink's 16-64 rank columns, a MoE router's
# 32-256 experts), not for a model's projections (the norm folded into the next GEMV's programs
# measured slower: docs/benchmarks.md, the 1B batch-1 row of the missed targets).
NORM_PROJECT_MAX_ROWS = 512


def norm_project_row(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    unit_offset: bool,
    weight: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    slot: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """One row x `[1, K]` (plus `residual`) RMS-normalized with `norm_weight` and projected by
    `weight` `[rows, K]` (+ `bias`), or with `slot` (one int32 on the device) by its slot's
    rows of a stacked `[slots, rows, K]`, in one launch (`_norm_project_row_kernel`): (the
    normed row, x + residual (None without a residual), the projection `[1, rows]` in
    `out_dtype`). Unlike `fused_add_rms_norm`, the results are new tensors."""
    k, rows = x.shape[1], weight.shape[-2]
    if x.shape[0] != 1 or x.stride(1) != 1 or (residual is not None and residual.stride(1) != 1):
        raise ValueError(f"norm_project_row takes one unit-stride row, got {tuple(x.shape)}")
    if weight.shape[-1] != k or weight.stride(-1) != 1 or rows > NORM_PROJECT_MAX_ROWS:
        raise ValueError(
            f"norm_project_row projects by <= {NORM_PROJECT_MAX_ROWS} unit-stride rows"
        )
    if (weight.dim() == 3) != (slot is not None):
        raise ValueError("a stacked [slots, rows, K] projection takes a slot, a plain one none")
    normed = torch.empty_like(x)
    summed = torch.empty_like(x) if residual is not None else None
    out = torch.empty((1, rows), dtype=out_dtype, device=x.device)
    block_k = _pow2(k)
    _norm_project_row_kernel[(rows,)](
        x,
        residual if residual is not None else x,
        norm_weight,
        weight,
        bias if bias is not None else norm_weight,
        slot if slot is not None else out,
        normed,
        summed if summed is not None else normed,
        out,
        k,
        weight.stride(0) if slot is not None else 0,
        weight.stride(-2),
        eps,
        HAS_RESIDUAL=residual is not None,
        UNIT_OFFSET=unit_offset,
        HAS_SLOT=slot is not None,
        HAS_BIAS=bias is not None,
        BLOCK_K=block_k,
        num_warps=4 if block_k <= 4096 else 8,
        **dependent_launch(x),
    )
    return normed, summed, out


def silu_and_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """[..., 2d] -> [..., d]: silu(gate) * up, in float32, rounded once."""
    return act_and_mul(gate_up, gelu=False, out=out)


def gelu_tanh_and_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """[..., 2d] -> [..., d]: gelu_tanh(gate) * up (Gemma's MLP), in float32, rounded once."""
    return act_and_mul(gate_up, gelu=True, out=out)


def act_and_mul(gate_up: torch.Tensor, gelu: bool, out: torch.Tensor | None = None) -> torch.Tensor:
    """act(gate) * up of [..., 2d] rows, act SiLU or (gelu) GELU-tanh, in one launch."""
    d = gate_up.shape[-1] // 2
    rows = gate_up.view(-1, 2 * d)
    if out is None:
        out = torch.empty((*gate_up.shape[:-1], d), dtype=gate_up.dtype, device=gate_up.device)
    out_rows = out.view(-1, d)
    if rows.stride(-1) != 1 or out_rows.stride(-1) != 1:
        raise ValueError("act_and_mul needs unit-stride rows")
    block = min(_pow2(d), _TILE // 2)
    _act_and_mul_kernel[(rows.shape[0], triton.cdiv(d, block))](
        rows,
        out_rows,
        d,
        rows.stride(0),
        out_rows.stride(0),
        GELU=gelu,
        BLOCK=block,
        num_warps=_warps(block, 4, 8),
        **dependent_launch(gate_up),
    )
    return out


class QKNorm(NamedTuple):
    """The per-head RMSNorms of the q and k heads (Qwen3's, Gemma 3's), which `rotary_and_store_kv`
    applies before rotating: weights [head_dim] each, one eps, Gemma's (1 + w) form or not."""

    q_weight: torch.Tensor
    k_weight: torch.Tensor
    eps: float
    unit_offset: bool


def rotary_and_store_kv(
    positions: torch.Tensor,
    qkv: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out_cache_loc: torch.Tensor,
    kv_scales: tuple[float, float] = (1.0, 1.0),
    qk_norm: QKNorm | None = None,
) -> None:
    """Neox rotary on the q and k heads of qkv [T, (heads + 2 * kv_heads) * head_dim], in place,
    and the rotated k and the v heads written to k_cache/v_cache [slots, kv_heads, head_dim] at
    rows out_cache_loc: what the attention backend's KV store would do, in the same launch.
    A one-byte (FP8) cache stores k / kv_scales[0] and v / kv_scales[1]. `qk_norm`: the q and
    k heads RMS-normalized first, as `rms_norm` over each head would (in place) before it."""
    tokens = qkv.shape[0]
    half = head_dim // 2
    if qkv.stride(-1) != 1 or qkv.shape[-1] != (num_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(f"qkv {tuple(qkv.shape)} is not unit-stride [tokens, q | k | v]")
    if head_dim % 2:
        raise ValueError(f"rotate-half rotary needs an even head_dim, got {head_dim}")
    if cos_cache.shape[-1] != half or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("cos/sin caches must be [positions, head_dim / 2], caches unit-stride")
    total_heads = num_heads + 2 * num_kv_heads
    block_half = _pow2(half)
    if tokens <= _ROTARY_SPREAD_MAX_TOKENS:
        block_h = 1
    else:
        block_h = min(_pow2(total_heads), max(1, _TILE // (2 * block_half)))
    _rotary_store_kv_kernel[(tokens, triton.cdiv(total_heads, block_h))](
        positions,
        qkv,
        cos_cache,
        sin_cache,
        k_cache,
        v_cache,
        out_cache_loc,
        qk_norm.q_weight if qk_norm is not None else cos_cache,
        qk_norm.k_weight if qk_norm is not None else cos_cache,
        num_heads,
        num_kv_heads,
        1.0 / kv_scales[0],
        1.0 / kv_scales[1],
        qk_norm.eps if qk_norm is not None else 0.0,
        positions.stride(0),
        qkv.stride(0),
        cos_cache.stride(0),
        sin_cache.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        out_cache_loc.stride(0),
        HALF=half,
        BLOCK_H=block_h,
        BLOCK_HALF=block_half,
        FP8_CACHE=k_cache.element_size() == 1,
        QK_NORM=qk_norm is not None,
        UNIT_OFFSET=qk_norm is not None and qk_norm.unit_offset,
        num_warps=_warps(2 * block_h * block_half, 4, 4),
        **dependent_launch(qkv),
    )


def store_cells(
    table: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor
) -> None:
    """table[rows[i], cols[i]] = values[i] (cast to the table's dtype) for a 2-D table with
    unit-stride rows: torch's index_put_ plus the cast, in one launch. rows, cols and values
    are 1-D device tensors of one length (distinct cells: which of two writes to one cell
    wins is undefined)."""
    n = rows.numel()
    if table.dim() != 2 or table.stride(1) != 1 or not cols.numel() == values.numel() == n:
        raise ValueError("store_cells needs a unit-stride 2-D table and equal-length indices")
    if n == 0:
        return
    # one block size for every n: no compile per batch size in the middle of serving
    _store_cells_kernel[(triton.cdiv(n, 256),)](
        table, table.stride(0), rows, cols, values, n, BLOCK=256
    )
