"""Projections of 2-16 rows (`small_m`): decode at small batch and the speculative verify step
(k=4 proposals are 5 rows at batch 1, 8 in its CUDA graph), optionally with the MLP's
SiLU-and-mul in the epilogue; `uses_small_m` says when a product takes it (layers/linear.py).

Why: at 2-16 rows a projection is still a stream of its weight. Llama-3-8B's o_proj at 8 rows
is 2 * 8 * 4096 * 4096 = 268 MFLOP against 32 MiB of bf16 weight: 8 FLOP a byte, where the
H200 balances at about 200 (989 TFLOP/s dense bf16 over 4.8 TB/s), so the time is bytes /
bandwidth, as at batch 1. cuBLAS reaches about 78% of the bandwidth at these sizes (issue 38:
the verify step cost 1.25x a batch-1 decode step, 0.98 ms of which were the projections
leaving the batch-1 GEMV for cuBLAS); the GEMV (kernels/gemv.py) streams about 90%.

How: each program owns BLOCK_N output columns (weight rows), loops over K, and loads each
weight tile [BLOCK_N, BLOCK_K] once for all M rows: acc[BLOCK_N, 16] += W_tile . x_tile^T on
the tensor cores, float32 accumulators. The rows are padded to 16, the MMA's smallest
dimension; the padded rows are masked, so they cost no memory traffic, and the MMA work is
negligible beside the stream. The weight is the dot's first operand (its rows are the MMA's M):
that lets a program own as few as 16 weight rows. An FMA reduction instead would cost M
multiply-adds a weight element: at 16 rows, 2.4 G elements/s * 16 = 77 TFLOP/s of float32
FMA, more than the H200's CUDA cores have, and at 8 rows half of them.

Each warp takes its own part of the K chunk (a batched dot over the chunk's parts, added once
after the loop): a plain [16, BLOCK_K] dot over 4 warps had the warps beyond the MMA's tiles
load, widen and multiply the same weights again. In Hopper SASS (compiled on the CPU: ptxas
ships with Triton) the loop then issues 1.4-2.1 thread instructions a weight for bf16 (about
16 fit in the issue rate at the copy bandwidth: far from bound) and 3.5-3.9 for FP8, whose
widening to bf16 is most of it (about 8 fit; a plain dot over 4 warps issued 11.7, bound).

Grid: what keeps the whole GPU streaming is programs, as the GEMV's two rows a program do. At
16 weight rows a program the smallest 8B projections (o 4096x4096, down 4096x14336) have 256
programs, about two an SM on the H200's 132, with the x tile re-read from L2 at M / BLOCK_N
of the weight's bytes (at most as much as the weight, usually half: the GEMV re-reads x at
half the weight's bytes too). Split-K across programs is not used: a partial sum per split
needs either a second pass (a launch, and the gated epilogue could no longer be fused) or
float32 atomics (sums in a run-dependent order: a replayed graph would not repeat its results
bit for bit), and at 16 rows a program no 8B projection is short of programs. Tiles per weight
shape are `block_config`'s.

Also: FP8 (e4m3) weights, weight-only as in the GEMV (widened exactly to the activation dtype
in the tile, one float32 scale per output row applied to the sum: half the bytes of bf16, no
activation quantization); programmatic dependent launch as every decode kernel; M is a
runtime argument that Triton does not specialize, so one compile serves every row count a
CUDA graph captures (2, 4, 8, 16).
"""

from __future__ import annotations

import torch

from radixserve.kernels.gemv import streams_weight
from radixserve.kernels.triton_support import (
    dependent_launch,
    dot_precision,
    jit,
    tl,
    triton,
    wait_for_prior_kernel,
)

MIN_ROWS, MAX_ROWS = 2, 16
_MMA_ROWS = 16  # the rows padded to the tensor-core dot's smallest dimension


@jit
def _tiles(w_rows, x_rows, ks, K, mask_n, mask_m, CHUNK_MASK: tl.constexpr, dtype: tl.constexpr):
    """The weight's [SPLITS, BLOCK_N, PART] and x's [SPLITS, PART, BLOCK_M] tiles at the K
    offsets `ks` [SPLITS, PART] of a chunk's parts, the weight widened to x's dtype (`dtype`);
    K masked only where the chunks do not divide it (CHUNK_MASK). Masked elements are zeros."""
    mask_w = mask_n[None, :, None]
    mask_x = mask_m[None, None, :]
    if CHUNK_MASK:
        mask_k = ks < K
        mask_w = mask_w & mask_k[:, None, :]
        mask_x = mask_x & mask_k[:, :, None]
    w = tl.load(w_rows + ks[:, None, :], mask=mask_w, other=0.0)
    x = tl.load(x_rows + ks[:, :, None], mask=mask_x, other=0.0)
    return w.to(dtype), x


@jit(do_not_specialize=["M"])
def _small_m_kernel(
    X,
    W,
    Bias,
    Scale,
    Y,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    GATED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLITS: tl.constexpr,
    CHUNK_MASK: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    """y[:M, BLOCK_N columns] = x[:M] . W[columns]^T, as acc[column, row] in float32.

    Each BLOCK_K chunk is cut into SPLITS consecutive parts, the batch dimension of a batched
    dot: Triton gives each warp its own part (SPLITS = warps), so that no two warps load,
    widen or multiply the same weights (with a plain [BLOCK_N, BLOCK_K] dot the warps beyond
    the MMA's tiles repeat them: the FP8 tile's widening then cost 11.7 issued instructions a
    weight in Hopper SASS, 4.0 split, against about 8 that the issue rate allows at the FP8
    bandwidth). The parts' sums are added once, after the loop.

    GATED: W is a fused [gate; up] projection of 2N rows and y = silu(gate) * up, each product
    rounded to the activation dtype first, the values of the product followed by the
    activation kernel; the up rows stream in the same loop.

    HAS_SCALE: W is FP8, widened to x's dtype in the tile (exact: every e4m3 value is a bf16
    and an fp16 value), and column n's sum is multiplied by Scale[n] (before the bias).

    Row m's sums are the same for every M: its products and their order do not depend on the
    other rows (padded rows are masked, zero)."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = cols < N
    ms = tl.arange(0, BLOCK_M)
    mask_m = ms < M
    # scales and bias are constants: read before the wait (see `wait_for_prior_kernel`)
    if HAS_SCALE:
        scale = tl.load(Scale + cols, mask=mask_n, other=0.0).to(tl.float32)
        if GATED:
            scale_up = tl.load(Scale + N + cols, mask=mask_n, other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(Bias + cols, mask=mask_n, other=0.0).to(tl.float32)
        if GATED:
            bias_up = tl.load(Bias + N + cols, mask=mask_n, other=0.0).to(tl.float32)
    wait_for_prior_kernel(PDL)
    PART: tl.constexpr = BLOCK_K // SPLITS
    parts = tl.arange(0, SPLITS)[:, None] * PART + tl.arange(0, PART)[None, :]
    w_rows = W + cols.to(tl.int64)[None, :, None] * stride_wn
    x_rows = X + ms.to(tl.int64)[None, None, :] * stride_xm
    acc = tl.zeros([SPLITS, BLOCK_N, BLOCK_M], dtype=tl.float32)
    if GATED:
        up_rows = w_rows + N.to(tl.int64) * stride_wn
        acc_up = tl.zeros([SPLITS, BLOCK_N, BLOCK_M], dtype=tl.float32)
    dtype = X.dtype.element_ty
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        ks = k0 + parts
        w, x = _tiles(w_rows, x_rows, ks, K, mask_n, mask_m, CHUNK_MASK, dtype)
        acc = tl.dot(w, x, acc, input_precision=DOT_PRECISION)
        if GATED:
            w_up, _ = _tiles(up_rows, x_rows, ks, K, mask_n, mask_m, CHUNK_MASK, dtype)
            acc_up = tl.dot(w_up, x, acc_up, input_precision=DOT_PRECISION)
    y = tl.sum(acc, axis=0)
    if HAS_SCALE:
        y *= scale[:, None]
    if HAS_BIAS:
        y += bias[:, None]
    # rounded to the activation dtype first: a float32 Y holds exactly `.float()` of that
    y = y.to(dtype)
    if GATED:
        up = tl.sum(acc_up, axis=0)
        if HAS_SCALE:
            up *= scale_up[:, None]
        if HAS_BIAS:
            up += bias_up[:, None]
        gate = y.to(tl.float32)
        up = up.to(dtype).to(tl.float32)
        y = (gate / (1.0 + tl.exp(-gate)) * up).to(dtype)
    out = Y + ms.to(tl.int64)[None, :] * stride_ym + cols[:, None]
    tl.store(out, y.to(Y.dtype.element_ty), mask=mask_n[:, None] & mask_m[None, :])


def block_config(n: int, k: int, fp8: bool = False) -> tuple[int, int, int, int]:
    """(weight rows a program, K chunk, warps = the chunk's parts, pipeline stages) for an
    [n, k] weight (n the output columns: half the rows of a gated [gate; up] weight).

    Measured (scripts/gpu/small_m.sh's tile sweep at M = 8, one H200, 2026-12-04: each 8B
    projection over 13 bf16 and 6 FP8 tiles): 16 rows a program, the MMA's minimum, so every
    SM streams (the 8B qkv, o, down and gate/up: 256-896 programs); 32 rows for the LM heads
    (4008 programs at 128256), which halves their x re-reads. 256-column chunks over 4 warps
    (128-byte row segments); 3 pipeline stages for K <= 8192 (qkv 15.3 us against 18.4 with
    4; o, gate/up within noise), 4 for the long down projection (30.2 against 32.9 with 3).
    FP8 takes the same 256-column chunks: half the bytes a stage, but the conversion to bf16
    keeps the warps busy; 512-column chunks were 9-39% slower on every shape."""
    rows = 32 if n >= 65536 else 16
    return rows, 256, 4, 4 if fp8 or k > 8192 else 3


def uses_small_m(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` (and `linear_silu_and_mul`, and the FP8 linear) take this kernel: x
    has 2-16 rows and the weight streams as in the batch-1 GEMV (`gemv.streams_weight`:
    half-precision activations on CUDA with the fused kernels on, bf16/fp16 or FP8 weight with
    unit-stride rows)."""
    return streams_weight(x, weight) and MIN_ROWS <= x.shape[0] <= MAX_ROWS


def small_m(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    gated: bool = False,
    scale: torch.Tensor | None = None,
    config: tuple[int, int, int, int] | None = None,
) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [M, K], 1 <= M <= 16; weight [N, K] with unit-stride
    rows; rounded to x's dtype, stored as `out_dtype` (default x's). `gated`: weight is
    [gate; up] and the result silu(gate) * up, N / 2 wide, each program taking its block of
    rows of each half. `scale` ([N] float32): the weight is FP8 and row r's true value is
    weight[r] * scale[r]. `config`: (weight rows a program (>= 16, the tensor-core dot's
    minimum), K chunk, warps, stages), by default `block_config`'s for the shape."""
    m, k = x.shape
    n = weight.shape[0]
    if not 1 <= m <= MAX_ROWS or weight.shape[1] != k or weight.stride(1) != 1 or gated and n % 2:
        raise ValueError(f"small_m: weight {tuple(weight.shape)} for x {tuple(x.shape)}")
    if gated:
        n //= 2
    block_n, block_k, num_warps, num_stages = config or block_config(n, k, scale is not None)
    if block_n < _MMA_ROWS or block_k % num_warps or block_k // num_warps < _MMA_ROWS:
        raise ValueError(f"small_m: tile {block_n} x {block_k} over {num_warps} warps")
    if x.stride(1) != 1:
        x = x.contiguous()
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    _small_m_kernel[(triton.cdiv(n, block_n),)](
        x,
        weight,
        bias if bias is not None else weight,
        scale if scale is not None else weight,
        y,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        y.stride(0),
        HAS_BIAS=bias is not None,
        HAS_SCALE=scale is not None,
        GATED=gated,
        BLOCK_M=_MMA_ROWS,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        SPLITS=num_warps,
        CHUNK_MASK=k % block_k != 0,
        NUM_STAGES=num_stages,
        DOT_PRECISION=dot_precision(x.dtype),
        num_warps=num_warps,
        **dependent_launch(x),
    )
    return y
