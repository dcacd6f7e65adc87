"""A MoE layer for a few tokens (decode at batch 1, tiny batches) as GEMVs over the routed
experts: two launches, no sort, no padding, no separate sum.

At batch 1 a MoE layer is a pure stream of its top-k experts' weights, and its time is those
bytes over the bandwidth. The grouped GEMM (fused_moe.py) is built for many tokens: it first
sorts the (token, slot) pairs by expert and pads each expert's run to a row block, then runs
row-block tiles that at batch 1 hold one real row in sixteen, over too few programs to keep
the GPU streaming, and sums the top-k rows in a last pass. Here, as for the dense projections
(gemv.py: a few output rows per program, so even a small matrix spreads over every SM):

1. `gate_up_gemv`: a program per (pair, block of intermediate rows) reads its expert id from
   topk_ids on the device (a captured graph serves any routing, no host sync), streams that
   expert's gate and up rows against the token's hidden vector and writes act(gate) * up.
   Program (0, 0) also counts the distinct experts into `expert_use` (what bench latency
   reads for the bytes a pass streams), as the grouped path's align kernel does.
2. `down_gemv`: a program per (token, block of hidden rows) streams the down rows of all the
   token's top-k experts in one K loop (each against its slot's activations, the experts'
   loads in flight together) and writes the routing-weighted sum: each program owns its
   output rows, so no atomics and no sum pass. It can add a tensor to the sum (DeepSeek's
   shared experts' output), which then needs no launch of its own.
3. `router_gemv`: a MoE router's logits in float32 from a float32 router (DeepSeek's), the
   cast and cuBLAS's float32 GEMM it replaces being two launches that wait on the kernel
   before in full (no PDL).

Weights: the model dtype, FP8 with per (expert, channel) scales, MXFP4 decoded in registers;
biases and the gated activations (SiLU, GELU-tanh, gpt-oss's clamped SwiGLU) through the
helpers the grouped GEMM uses (moe_experts.py), rounded where it rounds, so both paths give the
reference's values. Both kernels launch as programmatic dependents (PDL) and touch nothing
before their wait: everything they read depends on the routing, which the kernel before writes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.kernels.moe_experts import (
    MXFP4_GROUP,
    activation_code,
    finish_product,
    gated_activation,
    mxfp4_tile,
)
from radixserve.kernels.triton_support import (
    dependent_launch,
    jit,
    tl,
    triton,
    wait_for_prior_kernel,
)

# (token, slot) pairs up to which `fused_moe` takes these kernels: every pair streams its
# expert even when another pair of the step has the same one, so past a few tokens the grouped
# GEMM, which reads each used expert once, wins. Measured with the first tiles (bench_moe_gemv,
# 2026-12-04): at 1 token the GEMV was 1.39x faster for Qwen3 and even for the others, at 2
# tokens 1.20x faster for Qwen3 and 5-11% slower for gpt-oss and V2-Lite, at 8 slower for all;
# the down tiles measured since cut a token's down product by 30-50%, so 16 pairs (batch 2 of
# Qwen3, 4 of gpt-oss) stays, to be re-timed with them.
MAX_GEMV_PAIRS = 16


@dataclass(frozen=True)
class GemvTiles:
    """Each kernel's output rows a program (gate/up: of each half), K chunk (down: of each slot)
    and warps. Measured (scripts/gpu/bench_moe_gemv.py, one H200, 2026-12-04, one layer at
    batch 1 over DRAM-cold routings): gate/up one row, 512-column chunks, two warps was the best
    or within 1% of it at all three shapes (Qwen3-30B-A3B 14.0 us, gpt-oss-20b 33.5, V2-Lite
    18.2); down one row and four warps, with 128-column chunks up to a 2048-wide intermediate
    (Qwen3 8.2 us against 12.5 with the first guess (2, 256, 4), V2-Lite 11.7 against 24.2) and
    256 past it (gpt-oss's 2880: 20.9 against 23.7 with 128). `for_intermediate` picks."""

    gate_up_rows: int = 1
    gate_up_k: int = 512
    gate_up_warps: int = 2
    down_rows: int = 1
    down_k: int = 128
    down_warps: int = 4
    # > 1: the K loop software-pipelined, its chunks' loads issued stages - 1 chunks ahead into
    # shared memory (cp.async), as `gemv.block_config` takes where the step measured it faster;
    # 1, the plain loop. Not measured yet for these kernels: the tile sweep times both.
    gate_up_stages: int = 1
    down_stages: int = 1

    @classmethod
    def for_intermediate(cls, inter: int) -> GemvTiles:
        """The measured tiles for experts `inter` wide (the down projection's K)."""
        return cls() if inter <= 2048 else cls(down_k=256)


def uses_moe_gemv(tokens: int, top_k: int) -> bool:
    """Whether a pass of `tokens` tokens routed to `top_k` experts each takes these kernels."""
    return 0 < tokens * top_k <= MAX_GEMV_PAIRS


@jit
def _weight_tile(rows, scale_rows, ks, mask, MXFP4: tl.constexpr):
    """A [BLOCK_K, BLOCK_N] float32 tile of an expert's weight rows (`rows`, `scale_rows`: [1,
    BLOCK_N] pointers at each row's start), K along the first axis as the grouped GEMM reads
    it, so that MXFP4 decodes through the same `mxfp4_tile` (32 values a scale, MXFP4_GROUP).
    With [BLOCK_P, 1, BLOCK_N] pointers, the [BLOCK_P, BLOCK_K, BLOCK_N] tile of several
    experts (the K offsets broadcast along the leading axis)."""
    if MXFP4:
        tile = mxfp4_tile(
            rows + ks[:, None] // 2, scale_rows + ks[:, None] // 32, ks, mask, tl.float32
        )
    else:
        tile = tl.load(rows + ks[:, None], mask=mask, other=0.0).to(tl.float32)
    return tile


@jit
def _count_experts(TopkIds, ExpertUse, numel, BLOCK_P: tl.constexpr):
    """ExpertUse[0] += the distinct experts among the numel ids, ExpertUse[1] += 1."""
    lanes = tl.arange(0, BLOCK_P)
    valid = lanes < numel
    ids = tl.load(TopkIds + lanes, mask=valid, other=-1)
    earlier = (ids[:, None] == ids[None, :]) & (lanes[None, :] < lanes[:, None])
    first = valid & (tl.sum(earlier.to(tl.int32), axis=1) == 0)
    tl.store(ExpertUse, tl.load(ExpertUse) + tl.sum(first.to(tl.int64), 0))
    tl.store(ExpertUse + 1, tl.load(ExpertUse + 1) + 1)


@jit
def _gate_up_gemv_kernel(
    X,
    W,
    Scale,
    Bias,
    TopkIds,
    Acts,
    ExpertUse,
    N,
    K,
    numel,
    stride_xm,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_biase,
    stride_am,
    alpha,
    limit,
    TOP_K: tl.constexpr,
    ACT: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MXFP4: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_P: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PDL: tl.constexpr,
):
    """Acts[pair, rows] = act(gate_e . x) * (up_e . x) for pair's expert e = TopkIds[pair] and
    token pair // TOP_K. W is [E, 2N, K] ([gate; up], unit-stride K), or MXFP4 [E, 2N, K / 2]
    with Scale [E, 2N, K / 32]; FP8 (HAS_SCALE): Scale [E, 2N]; Bias [E, 2N]. Products
    accumulate elementwise in float32 across the K loop and are reduced once at the end."""
    pair = tl.program_id(0)
    block = tl.program_id(1)
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rows < N
    wait_for_prior_kernel(PDL)
    if (pair == 0) & (block == 0):
        _count_experts(TopkIds, ExpertUse, numel, BLOCK_P)
    expert = tl.load(TopkIds + pair).to(tl.int64)
    x_row = X + (pair // TOP_K).to(tl.int64) * stride_xm
    gate_rows = W + expert * stride_we + rows[None, :].to(tl.int64) * stride_wn
    up_rows = W + expert * stride_we + (rows + N)[None, :].to(tl.int64) * stride_wn
    gate_scales = Scale + expert * stride_se + rows[None, :].to(tl.int64) * stride_sn
    up_scales = Scale + expert * stride_se + (rows + N)[None, :].to(tl.int64) * stride_sn
    acc = tl.zeros([BLOCK_K, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_K, BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < K
        mask = k_mask[:, None] & n_mask[None, :]
        x = tl.load(x_row + ks, mask=k_mask, other=0.0).to(tl.float32)[:, None]
        acc += _weight_tile(gate_rows, gate_scales, ks, mask, MXFP4) * x
        acc_up += _weight_tile(up_rows, up_scales, ks, mask, MXFP4) * x
    dtype = Acts.dtype.element_ty
    channels = Scale + expert * stride_se
    biases = Bias + expert * stride_biase
    gate = finish_product(
        tl.sum(acc, 0), channels, biases, rows, n_mask, dtype, HAS_SCALE, HAS_BIAS
    )
    up = finish_product(
        tl.sum(acc_up, 0), channels + N, biases + N, rows, n_mask, dtype, HAS_SCALE, HAS_BIAS
    )
    out = gated_activation(gate, up, alpha, limit, ACT)
    tl.store(Acts + pair.to(tl.int64) * stride_am + rows, out.to(dtype), mask=n_mask)


@jit
def _down_gemv_kernel(
    Acts,
    W,
    Scale,
    Bias,
    TopkIds,
    TopkWeights,
    Add,
    Out,
    N,
    K,
    stride_am,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_biase,
    stride_addm,
    stride_om,
    TOP_K: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_ADD: tl.constexpr,
    MXFP4: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PDL: tl.constexpr,
):
    """Out[token, rows] = sum over the token's slots of TopkWeights[pair] * (down_e . Acts[pair]
    (+ bias)): each slot's product finished (scale, rounding, bias) and weighted, rounded to the
    activation dtype as the grouped GEMM stores it, and summed in float32 as its top-k sum is;
    with HAS_ADD, plus Add[token, rows] before the sum is rounded.
    W is [E, N, K], or MXFP4 [E, N, K / 2] with Scale [E, N, K / 32]; FP8: Scale [E, N].

    All the token's slots (BLOCK_P >= TOP_K of them) stream in the same K loop, a [BLOCK_P,
    BLOCK_K, BLOCK_N] tile a chunk: the experts' loads are in flight together, not one expert's
    after the other's (one expert's down rows spread over the GPU are too few bytes a
    program to keep the memory busy at Qwen3's 768-wide intermediate)."""
    token = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rows < N
    slots = tl.arange(0, BLOCK_P)
    slot_mask = slots < TOP_K
    pairs = token * TOP_K + slots
    wait_for_prior_kernel(PDL)
    experts = tl.load(TopkIds + pairs, mask=slot_mask, other=0).to(tl.int64)[:, None]
    weights = tl.load(TopkWeights + pairs, mask=slot_mask, other=0.0)
    a_rows = Acts + pairs.to(tl.int64)[:, None] * stride_am
    row_offsets = rows.to(tl.int64)[None, None, :]
    w_rows = (W + experts * stride_we)[:, :, None] + row_offsets * stride_wn
    s_rows = (Scale + experts * stride_se)[:, :, None] + row_offsets * stride_sn
    row_mask = slot_mask[:, None, None] & n_mask[None, None, :]
    acc = tl.zeros([BLOCK_P, BLOCK_K, BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < K
        a_mask = slot_mask[:, None] & k_mask[None, :]
        a = tl.load(a_rows + ks[None, :], mask=a_mask, other=0.0).to(tl.float32)
        tile = _weight_tile(w_rows, s_rows, ks, row_mask & k_mask[None, :, None], MXFP4)
        acc += tile * a[:, :, None]
    y = finish_product(
        tl.sum(acc, 1),
        Scale + experts * stride_se,
        Bias + experts * stride_biase,
        rows[None, :],
        n_mask[None, :],
        Out.dtype.element_ty,
        HAS_SCALE,
        HAS_BIAS,
    )
    weighted = (y * weights[:, None]).to(Out.dtype.element_ty).to(tl.float32)
    total = tl.sum(weighted, 0)
    if HAS_ADD:
        add = tl.load(Add + token.to(tl.int64) * stride_addm + rows, mask=n_mask, other=0.0)
        total += add.to(tl.float32)
    tl.store(
        Out + token.to(tl.int64) * stride_om + rows, total.to(Out.dtype.element_ty), mask=n_mask
    )


def _scale_strides(scale: torch.Tensor | None, mxfp4: bool) -> tuple[int, int]:
    """(per expert, per row) strides of a scale tensor; rows have none for FP8's [E, N]."""
    if scale is None:
        return 0, 0
    return scale.stride(0), scale.stride(1) if mxfp4 else 0


def _check_weights(w: torch.Tensor, scale: torch.Tensor | None, block_k: int) -> bool:
    """Whether `w` is MXFP4 (uint8), after checking what the kernels assume of it."""
    if w.stride(-1) != 1:
        raise ValueError("the MoE GEMV needs unit-stride expert rows")
    mxfp4 = w.dtype == torch.uint8
    if mxfp4 and (scale is None or block_k % MXFP4_GROUP):
        raise ValueError(f"MXFP4 experts need their scales and K chunks of {MXFP4_GROUP}s")
    return mxfp4


def gate_up_gemv(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_use: torch.Tensor,
    activation: str = "silu",
    w13_scale: torch.Tensor | None = None,
    w13_bias: torch.Tensor | None = None,
    swiglu: tuple[float, float] = (1.702, 7.0),
    tiles: GemvTiles | None = None,
) -> torch.Tensor:
    """acts [T * top_k, I]: act(gate_e(x_t)) * up_e(x_t) for every (token t, slot) pair, e its
    expert; `expert_use` [2] int64 accumulates (distinct experts, passes). `tiles` by default
    the measured ones for the experts' width."""
    tokens, hidden_size = hidden.shape
    top_k = topk_ids.shape[1]
    numel = tokens * top_k
    inter = w13.shape[1] // 2
    tiles = tiles or GemvTiles.for_intermediate(inter)
    mxfp4 = _check_weights(w13, w13_scale, tiles.gate_up_k)
    if hidden.stride(-1) != 1:
        raise ValueError("the MoE GEMV needs unit-stride hidden rows")
    acts = torch.empty((numel, inter), dtype=hidden.dtype, device=hidden.device)
    _gate_up_gemv_kernel[(numel, triton.cdiv(inter, tiles.gate_up_rows))](
        hidden,
        w13,
        w13_scale if w13_scale is not None else w13,
        w13_bias if w13_bias is not None else w13,
        topk_ids,
        acts,
        expert_use,
        inter,
        hidden_size,
        numel,
        hidden.stride(0),
        w13.stride(0),
        w13.stride(1),
        *_scale_strides(w13_scale, mxfp4),
        w13_bias.stride(0) if w13_bias is not None else 0,
        acts.stride(0),
        swiglu[0],
        swiglu[1],
        TOP_K=top_k,
        ACT=activation_code(activation),
        HAS_SCALE=w13_scale is not None and not mxfp4,
        HAS_BIAS=w13_bias is not None,
        MXFP4=mxfp4,
        BLOCK_N=tiles.gate_up_rows,
        BLOCK_K=tiles.gate_up_k,
        BLOCK_P=triton.next_power_of_2(numel),
        NUM_STAGES=tiles.gate_up_stages,
        num_warps=tiles.gate_up_warps,
        **dependent_launch(hidden),
    )
    return acts


def down_gemv(
    acts: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w2_scale: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    tiles: GemvTiles | None = None,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """[T, H]: per token, sum over its slots of topk_weights * down_e(acts[pair]), plus `add`
    [T, H] where given. `tiles` by default the measured ones for the experts' width (acts'
    columns)."""
    tiles = tiles or GemvTiles.for_intermediate(acts.shape[1])
    tokens, top_k = topk_ids.shape
    hidden_size = w2.shape[1]
    mxfp4 = _check_weights(w2, w2_scale, tiles.down_k)
    if add is not None and add.stride(-1) != 1:
        raise ValueError("the MoE GEMV adds unit-stride rows")
    out = torch.empty((tokens, hidden_size), dtype=acts.dtype, device=acts.device)
    _down_gemv_kernel[(tokens, triton.cdiv(hidden_size, tiles.down_rows))](
        acts,
        w2,
        w2_scale if w2_scale is not None else w2,
        w2_bias if w2_bias is not None else w2,
        topk_ids,
        topk_weights.reshape(-1),
        add if add is not None else out,  # never read without add
        out,
        hidden_size,
        acts.shape[1],
        acts.stride(0),
        w2.stride(0),
        w2.stride(1),
        *_scale_strides(w2_scale, mxfp4),
        w2_bias.stride(0) if w2_bias is not None else 0,
        add.stride(0) if add is not None else 0,
        out.stride(0),
        TOP_K=top_k,
        HAS_SCALE=w2_scale is not None and not mxfp4,
        HAS_BIAS=w2_bias is not None,
        HAS_ADD=add is not None,
        MXFP4=mxfp4,
        BLOCK_P=triton.next_power_of_2(top_k),
        BLOCK_N=tiles.down_rows,
        BLOCK_K=tiles.down_k,
        NUM_STAGES=tiles.down_stages,
        num_warps=tiles.down_warps,
        **dependent_launch(acts),
    )
    return out


def fused_moe_gemv(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_use: torch.Tensor,
    activation: str = "silu",
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    swiglu: tuple[float, float] = (1.702, 7.0),
    tiles: GemvTiles | None = None,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """`fused_moe`'s result (same arguments and shapes, see there) in two GEMV launches."""
    acts = gate_up_gemv(
        hidden, w13, topk_ids, expert_use, activation, w13_scale, w13_bias, swiglu, tiles
    )
    return down_gemv(acts, w2, topk_weights, topk_ids, w2_scale, w2_bias, tiles, add)


# The router GEMV's tile: experts a program and the K chunk. At DeepSeek's 64-256 experts of a
# 2048-7168 wide hidden state a program streams 2 experts' float32 rows (16-56 KB), so at
# batch 1 there are 32-128 programs; the router is 0.5-7 MB, a few microseconds either way.
ROUTER_BLOCK_E = 2
ROUTER_BLOCK_K = 512


@jit
def _router_gemv_kernel(
    X,
    W,
    Out,
    E,
    K,
    stride_xm,
    stride_we,
    stride_om,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """Out[token, experts] = float32(X[token]) . W[experts] in float32."""
    token = tl.program_id(0).to(tl.int64)
    experts = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    e_mask = experts < E
    w_rows = W + experts.to(tl.int64)[:, None] * stride_we
    wait_for_prior_kernel(PDL)
    acc = tl.zeros([BLOCK_E, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < K
        x = tl.load(X + token * stride_xm + ks, mask=k_mask, other=0.0).to(tl.float32)
        w = tl.load(w_rows + ks[None, :], mask=e_mask[:, None] & k_mask[None, :], other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    tl.store(Out + token * stride_om + experts, tl.sum(acc, 1), mask=e_mask)


def router_gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`F.linear(x.float(), weight)` for a float32 router `weight` [E, H] and a few tokens x
    [T, H], in one dependent launch: logits [T, E] float32."""
    tokens, hidden_size = x.shape
    num_experts = weight.shape[0]
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("the router GEMV needs unit-stride rows")
    out = torch.empty((tokens, num_experts), dtype=torch.float32, device=x.device)
    _router_gemv_kernel[(tokens, triton.cdiv(num_experts, ROUTER_BLOCK_E))](
        x,
        weight,
        out,
        num_experts,
        hidden_size,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        BLOCK_E=ROUTER_BLOCK_E,
        BLOCK_K=ROUTER_BLOCK_K,
        **dependent_launch(x),
    )
    return out
