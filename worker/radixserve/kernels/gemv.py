"""Batch-1 projections as a Triton matrix-vector product (`gemv`), optionally with the MLP's
SiLU-and-mul in its epilogue; `uses_gemv` says when a product takes it (layers/linear.py).

At batch 1 a projection reads its whole weight to produce one row: it is a pure stream of the
weight, and the time is bytes / bandwidth. On the H200 cuBLAS reaches 40-75% of the bandwidth
on the small matrices of a decode step (scripts/gpu/bench_gemv.py, 2026-11-29: 1B o_proj
2048x2048 5.2 us against a 2.0 us floor, 8B o_proj 10.8 us against 7.9 us); this GEMV, two
rows per program so that the whole GPU streams even the smallest matrix, took 3.0 and 6.3 us
and beat cuBLAS on every projection of the 1B and 8B shapes, LM heads included.

The same kernel streams FP8 weights (one scale per output row, applied to the row's sum):
weight-only FP8 at batch 1 moves half the bytes of bf16 for the same product, with no
activation quantization at all (layers/quantization/fp8.py routes its batch-1 rows here).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from radixserve.kernels import triton_support
from radixserve.kernels.triton_support import (
    dependent_launch,
    jit,
    tl,
    triton,
    wait_for_prior_kernel,
)


class LoRAEpilogue(NamedTuple):
    """A LoRA adapter's expand (layers/lora_linear.py) done in the GEMV's epilogue: the row's `s`
    (kernels/lora.py `shrink`'s output for one row, whole: `[1, 1, n_sub * rank]`), the
    slot-stacked B `[slots, N, rank]` and the row's slot (a one-element int32 tensor, -1 for the
    base model: read on the device, so a captured graph serves any adapter). `sub_sizes`: the
    widths of the projections fused in the weight (q, k, v: at most three; default one), each
    with its own rank columns of s; a gated [gate; up] pair is two. At batch 1 this saves the
    expand's launch and keeps the gated epilogue (the MLP's activation) for adapters too."""

    s: torch.Tensor
    b: torch.Tensor
    slot: torch.Tensor
    sub_sizes: tuple[int, ...] = ()


@jit
def _lora_b_rows(B, slot, b_rows, row_ok, rank, stride_bs, stride_bn, BLOCK_R: tl.constexpr):
    """B[slot, b_row, :rank] for each row (zeros for the base model's slot -1), and whether the
    row takes an adapter."""
    rows_on = row_ok & (b_rows * 0 + slot >= 0)  # (vector-shaped: the interpreter's masks)
    rs = tl.arange(0, BLOCK_R)
    b = tl.load(
        B
        + tl.maximum(slot, 0) * stride_bs
        + b_rows[:, None].to(tl.int64) * stride_bn
        + rs[None, :],
        mask=rows_on[:, None] & (rs < rank)[None, :],
        other=0.0,
    )
    return b, rows_on


@jit
def _lora_s_rows(S, subs, rows_on, rank, BLOCK_R: tl.constexpr):
    """Each row's s[sub * rank : (sub + 1) * rank] (the one-row shrink's output, whole)."""
    rs = tl.arange(0, BLOCK_R)
    return tl.load(
        S + (subs * rank)[:, None] + rs[None, :],
        mask=rows_on[:, None] & (rs < rank)[None, :],
        other=0.0,
    )


@jit
def _gemv_kernel(
    X,
    W,
    Bias,
    Scale,
    Y,
    LoraS,
    LoraB,
    LoraSlot,
    N,
    K,
    stride_wn,
    lora_rank,
    lora_sub1,
    lora_sub2,
    stride_lbs,
    stride_lbn,
    HAS_BIAS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    GATED: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    LORA: tl.constexpr,
    LORA_BLOCK_R: tl.constexpr,
    PDL: tl.constexpr,
):
    """y[BLOCK_N rows] = W[rows] . x: products accumulate elementwise in float32 across the
    K loop and are reduced once at the end.

    GATED: W is a fused [gate; up] projection of 2N rows and y = silu(gate . x) * (up . x), each
    product rounded to the activation dtype first, as the GEMV followed by `silu_and_mul` would
    compute it; the up rows stream in the same loop, so the activation costs no launch.

    HAS_SCALE: W is quantized and row r's sum is multiplied by Scale[r] (before the bias).

    LORA: the row's adapter term (`LoRAEpilogue`) is added to each rounded output, gate and up
    alike, and the sum rounded again: the values of the GEMV followed by the expand kernel.
    Output row r belongs to sub-projection (r >= lora_sub1) + (r >= lora_sub2) (q, k, v; both
    N for one projection), which takes that many rank columns of s; for GATED the gate takes
    s's first rank columns and up the next (B's up rows at N + row). B's rows and the slot are
    read before the wait (a constant and a step input: their HBM round trip was most of the
    epilogue's cost, 4 us a step at the 8B down projection, when read after the loop); s, the
    shrink's output just written, right after the wait: its loads are in flight while the loop
    streams W (read after the loop, each program paid an L2 round trip at its end, once a wave
    of programs: gate/up's GEMV took 8.5 us longer at 14 waves, H200 2026-12-04).

    NUM_STAGES > 1: the loop is software-pipelined, its chunks' loads issued NUM_STAGES - 1
    chunks ahead into shared memory (cp.async); 1 is the plain loop, each chunk loaded where it
    is used (Triton pipelines loads that feed no dot only when the loop asks)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rows < N
    # scales and bias are constants: read before the wait, they are not a round trip at the
    # end of the last programs (see `wait_for_prior_kernel`)
    if HAS_SCALE:
        scale = tl.load(Scale + rows, mask=mask_n, other=0.0).to(tl.float32)
        if GATED:
            scale_up = tl.load(Scale + N + rows, mask=mask_n, other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(Bias + rows, mask=mask_n, other=0.0).to(tl.float32)
        if GATED:
            bias_up = tl.load(Bias + N + rows, mask=mask_n, other=0.0).to(tl.float32)
    if LORA:  # the row's adapter slot is a step input, B a constant: off the tail
        lora_slot = tl.load(LoraSlot).to(tl.int64)
        subs = (rows >= lora_sub1).to(tl.int32) + (rows >= lora_sub2).to(tl.int32)
        b_lora, lora_on = _lora_b_rows(
            LoraB, lora_slot, rows, mask_n, lora_rank, stride_lbs, stride_lbn, LORA_BLOCK_R
        )
        if GATED:
            b_lora_up, _ = _lora_b_rows(
                LoraB, lora_slot, N + rows, mask_n, lora_rank, stride_lbs, stride_lbn, LORA_BLOCK_R
            )
    wait_for_prior_kernel(PDL)
    if LORA:  # s, the shrink's output: its loads issued here, their latency under the loop's
        s_lora = _lora_s_rows(LoraS, subs, lora_on, lora_rank, LORA_BLOCK_R)
        if GATED:
            s_lora_up = _lora_s_rows(LoraS, subs + 1, lora_on, lora_rank, LORA_BLOCK_R)
    w_rows = W + rows.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    if GATED:
        up_rows = w_rows + N.to(tl.int64) * stride_wn
        acc_up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        ks = k0 + tl.arange(0, BLOCK_K)
        mask_k = ks < K
        mask_w = mask_n[:, None] & mask_k[None, :]
        x = tl.load(X + ks, mask=mask_k, other=0.0).to(tl.float32)
        w = tl.load(w_rows + ks[None, :], mask=mask_w, other=0.0)
        acc += w.to(tl.float32) * x[None, :]
        if GATED:
            w_up = tl.load(up_rows + ks[None, :], mask=mask_w, other=0.0)
            acc_up += w_up.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_SCALE:
        y *= scale
    if HAS_BIAS:
        y += bias
    # rounded to the activation dtype first: a float32 Y holds exactly `.float()` of that
    y = y.to(X.dtype.element_ty)
    if LORA:
        delta = tl.sum(s_lora.to(LoraB.dtype.element_ty).to(tl.float32) * b_lora.to(tl.float32), 1)
        y = (y.to(tl.float32) + delta).to(X.dtype.element_ty)
    if GATED:
        up = tl.sum(acc_up, axis=1)
        if HAS_SCALE:
            up *= scale_up
        if HAS_BIAS:
            up += bias_up
        gate = y.to(tl.float32)
        up = up.to(X.dtype.element_ty)
        if LORA:
            up_s = s_lora_up.to(LoraB.dtype.element_ty).to(tl.float32)
            delta_up = tl.sum(up_s * b_lora_up.to(tl.float32), 1)
            up = (up.to(tl.float32) + delta_up).to(X.dtype.element_ty)
        up = up.to(tl.float32)
        y = (gate / (1.0 + tl.exp(-gate)) * up).to(X.dtype.element_ty)
    tl.store(Y + rows, y.to(Y.dtype.element_ty), mask=mask_n)


def block_config(n: int, k: int, fp8: bool = False) -> tuple[int, int, int, int]:
    """(rows per program, K chunk, warps, pipeline stages): the fastest of bench_gemv.py's
    sweep per shape class on the H200 (FP8 weights: bench_fp8_gemv.py's, where they differ,
    kept only where the decode step measured the gain). Large matrices want long chunks and
    few warps; small ones more warps per row."""
    if fp8 and k >= 4096 and n >= 4096:
        # 8B shapes, chosen in the decode step, not alone (a tile's time alone is not its
        # time there: down's best alone, 15.5 us, took 19.6 in the step). scripts/gpu/
        # step_tiles.py, 2026-12-02 09:45 UTC, each candidate against the tiles before (qkv
        # and gate_up (8, 1024, 2, 3), o and down the plain (2, 1024, 1, 1)), us a step: qkv
        # (8, 512, 2, 4) -29.8, o (8, 1024, 4, 3) -7.1, down (8, 1024, 4, 3) -54.7; no
        # candidate beat gate_up's. 70B's shapes (K 8192, rows 8192 and up) were not measured
        # and stay plain.
        if n > k and k < 8192:  # qkv, gate_up
            return (8, 512, 2, 4) if n * k < 32 << 20 else (8, 1024, 2, 3)
        if n <= k and n < 8192:  # o, down
            return 8, 1024, 4, 3
        return 2, 1024, 1, 1
    if n * k >= 32 << 20:  # gate/up, down (8B), LM heads
        return 2, 2048, 2, 1
    if k >= 4096 and n >= 4096:  # 8B qkv and o
        return 2, 512, 2, 1
    return 2, 1024, 4, 1  # 1B qkv, o, down


def uses_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` (and `linear_silu_and_mul`) take the GEMV: x is one half-precision row on
    a CUDA device where the fused kernels are on (tests turn them off through
    `triton_support.enabled_for` to get the torch path), and the weight has unit-stride rows.
    float32 stays on cuBLAS: it is the exactness reference, and not where speed is measured."""
    return (
        triton_support.enabled_for(x)
        and x.dim() == 2
        and x.shape[0] == 1
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype in (x.dtype, torch.float8_e4m3fn)
        and weight.stride(1) == 1
    )


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    block_n: int = 4,
    block_k: int = 512,
    num_warps: int = 4,
    num_stages: int = 1,
    out_dtype: torch.dtype | None = None,
    gated: bool = False,
    scale: torch.Tensor | None = None,
    lora: LoRAEpilogue | None = None,
) -> torch.Tensor:
    """F.linear(x, weight, bias) for x of one row ([1, K] or [K]); weight [N, K] unit-stride
    rows; rounded to x's dtype, stored as `out_dtype` (default x's). `gated`: weight is
    [gate; up] and the result silu(gate) * up, N / 2 wide; each program then takes `block_n / 2`
    rows of each half, so it streams as many rows as the plain product's programs. `scale`
    ([N] float32): the weight is quantized (FP8) and row r's true value is weight[r] * scale[r].
    `num_stages` > 1 pipelines the K loop (see _gemv_kernel); the sums are the same. `lora`: the
    row's adapter term added in the epilogue (`LoRAEpilogue`)."""
    k = x.shape[-1]
    n = weight.shape[0]
    if x.numel() != k or weight.shape[1] != k or weight.stride(1) != 1 or (gated and n % 2):
        raise ValueError(f"gemv needs one row x and [N, K] weight, got {x.shape}, {weight.shape}")
    if gated:
        n, block_n = n // 2, max(1, block_n // 2)
    y = torch.empty((*x.shape[:-1], n), dtype=out_dtype or x.dtype, device=x.device)
    if lora is not None:
        if lora.b.shape[1] != weight.shape[0]:
            raise ValueError(f"LoRA B {tuple(lora.b.shape)} does not fit {weight.shape[0]} rows")
        if lora.s.shape[:2] != (1, 1) or lora.s.stride(2) != 1:
            raise ValueError(f"LoRA s {tuple(lora.s.shape)} is not one row's whole product")
        rank = lora.b.shape[2]
        s_lora, b_lora, slot = lora.s, lora.b, lora.slot
        sizes = lora.sub_sizes or (n,)
        if len(sizes) > 3 or sum(sizes) != n or (gated and len(sizes) > 1):
            raise ValueError(f"sub-projections {sizes} do not make {n} output rows")
        bounds = [sum(sizes[: i + 1]) for i in range(len(sizes) - 1)] + [n, n]
        lora_args = (rank, bounds[0], bounds[1])
        lora_strides = (lora.b.stride(0), lora.b.stride(1))
    else:
        s_lora = b_lora = slot = weight
        lora_args, lora_strides, rank = (1, n, n), (0, 0), 1
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x.contiguous(),
        weight,
        bias if bias is not None else weight,
        scale if scale is not None else weight,
        y,
        s_lora,
        b_lora,
        slot,
        n,
        k,
        weight.stride(0),
        *lora_args,
        *lora_strides,
        HAS_BIAS=bias is not None,
        HAS_SCALE=scale is not None,
        GATED=gated,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        NUM_STAGES=num_stages,
        LORA=lora is not None,
        LORA_BLOCK_R=max(16, triton.next_power_of_2(rank)),
        num_warps=num_warps,
        **dependent_launch(x),
    )
    return y
