"""Products of a few rows (2-16: small decode batches, a verify step's k + 1 positions) as a
Triton GEMM that streams the weight at the memory bandwidth, like the batch-1 GEMV; `skinny_tile`
says when a product takes it (layers/linear.py).

At a few rows a projection is still a stream of its weight: 5 rows read the same bytes as 1.
cuBLAS's kernels for such shapes stream below the bandwidth: an 8B verify step (k = 4, 5 rows)
took 6.47 ms against a batch-1 decode step's 5.34 on an H100 (1.21x), 5.65 ms of it in cuBLAS's
kernels (spec_decode_bench.py verify --profile, 2026-12-05), and a batch-2 decode step took
1.15x batch 1's on an H200. The GEMV's form (products accumulated elementwise in registers)
does not carry over: at 8 rows its accumulators took 200 registers a thread, too few programs
per SM kept too few bytes in flight, and it ran 3x slower than cuBLAS (branch gemv-rows,
2026-12-05).

Here the product is computed transposed, y^T = W x^T, as a tensor-core dot: a program takes
BLOCK_N output features (rows of W) against all the rows of x padded to BLOCK_M = 16, so its
accumulator is BLOCK_N x 16 floats whatever the row count, and the weight chunks stream through
shared memory in a NUM_STAGES-deep pipeline (Triton's cp.async pipelining of a dot's operands):
the bytes in flight sit in shared memory, not in registers.

Where it runs: only on a device and weight shape named in `SKINNY_TILES`, each measured
faster in the step than cuBLAS with that tile; everywhere else cuBLAS, as before it. The
measurements disagree by machine (docs/benchmark-log.md, 2026-12-05):
- H100, late evening: as landed here (these tiles, launched plainly), an 8B verify step (k = 4,
  batch 1) took 5.906 and 6.007 ms against 6.262 with the table emptied (cuBLAS), the same
  machine, one process each: 1.122-1.142x a batch-1 decode step against 1.191x; batch-2
  decode 5.538-5.540 against 5.801 ms, batch 8 5.791-5.794 against 6.058. On another machine,
  with the same tiles on the tree before (two processes each, ABBA) the figures moved alike
  (verify 6.268-6.285 against 6.494-6.582 ms). Launched as a programmatic dependent (PDL) the
  same tiles took 6.575 ms there: the early launch costs more than it saves, so this is the
  one Triton kernel of the step that launches plainly. Without PDL each product costs in the
  step what it costs alone (a batch-2 timeline: within 0.1-3.4 us a product).
- H200, afternoon: slower in the step than cuBLAS with every tile tried, with PDL and without
  (verify 5.63-6.00 ms against 5.09; batch-2 decode 5.08-5.45 against 4.50), in one call whose
  machine drifted 3.5%. Not settled, so the H200 has no tiles here and keeps cuBLAS.
"""

from __future__ import annotations

import functools

import torch

from radixserve.kernels import triton_support
from radixserve.kernels.triton_support import jit, tl, triton

# the rows one launch takes: a verify step of k <= 15 at batch 1, decode batches up to 16
MAX_ROWS = 16


@jit
def _skinny_gemm_kernel(
    X,
    W,
    Bias,
    Y,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """y[:M, BLOCK_N features] = x[:M] . W[features]^T, computed as W[features] . x^T so that the
    features fill the tensor cores' long side and the few rows the short one (padded to BLOCK_M
    with zeros, never stored).

    GATED: W is a fused [gate; up] projection of 2N rows and y = silu(gate . x) * (up . x), each
    product rounded to the activation dtype first, as the product followed by `silu_and_mul`
    would compute it (the GEMV's epilogue, kernels/gemv.py)."""
    features = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ms = tl.arange(0, BLOCK_M)
    mask_n = features < N
    mask_m = ms < M
    if HAS_BIAS:
        bias = tl.load(Bias + features, mask=mask_n, other=0.0).to(tl.float32)
        if GATED:
            bias_up = tl.load(Bias + N + features, mask=mask_n, other=0.0).to(tl.float32)
    w_rows = W + features.to(tl.int64)[:, None] * stride_wn
    x_cols = X + ms[None, :] * stride_xm
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    if GATED:
        up_rows = w_rows + N.to(tl.int64) * stride_wn
        acc_up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        ks = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            mask_w = mask_n[:, None]
            mask_x = mask_m[None, :]
        else:
            mask_w = mask_n[:, None] & (ks < K)[None, :]
            mask_x = mask_m[None, :] & (ks < K)[:, None]
        xt = tl.load(x_cols + ks[:, None], mask=mask_x, other=0.0)  # [BLOCK_K, BLOCK_M]
        w = tl.load(w_rows + ks[None, :], mask=mask_w, other=0.0)
        acc = tl.dot(w, xt, acc)
        if GATED:
            w_up = tl.load(up_rows + ks[None, :], mask=mask_w, other=0.0)
            acc_up = tl.dot(w_up, xt, acc_up)
    if HAS_BIAS:
        acc += bias[:, None]
    # rounded to the activation dtype first: a float32 Y holds exactly `.float()` of that
    y = acc.to(X.dtype.element_ty)
    if GATED:
        if HAS_BIAS:
            acc_up += bias_up[:, None]
        gate = y.to(tl.float32)
        up = acc_up.to(X.dtype.element_ty).to(tl.float32)
        y = (gate / (1.0 + tl.exp(-gate)) * up).to(X.dtype.element_ty)
    out = Y + ms[None, :] * stride_ym + features[:, None]
    tl.store(out, y.to(Y.dtype.element_ty), mask=mask_n[:, None] & mask_m[None, :])


# (features per program, K chunk, warps, pipeline stages) by device name, then by (output
# features, K, gated): the tiles measured faster in the step than cuBLAS (the module's docstring;
# bench_skinny.py's sweep picks them, spec_decode_bench.py verify and decode_timeline.py judge
# them in the step). A gated product is keyed by its half, the MLP's intermediate size.
SKINNY_TILES: dict[str, dict[tuple[int, int, bool], tuple[int, int, int, int]]] = {
    "NVIDIA H100 80GB HBM3": {  # the Llama-3-8B shape's projections
        (6144, 4096, False): (64, 128, 4, 4),  # q/k/v
        (4096, 4096, False): (64, 128, 4, 6),  # o
        (14336, 4096, True): (64, 128, 4, 4),  # gate/up with the activation
        (4096, 14336, False): (32, 256, 4, 4),  # down
        (128256, 4096, False): (64, 128, 4, 6),  # LM head (float32 logits)
    },
}


@functools.cache
def _device_tiles(device_index: int) -> dict[tuple[int, int, bool], tuple[int, int, int, int]]:
    return SKINNY_TILES.get(torch.cuda.get_device_name(device_index), {})


def skinny_tile(
    x: torch.Tensor, weight: torch.Tensor, gated: bool = False
) -> tuple[int, int, int, int] | None:
    """The tile `linear` (and, `gated`, `linear_silu_and_mul`) runs the skinny GEMM with, or None
    for cuBLAS: x is 2 to MAX_ROWS half-precision rows on a CUDA device where the fused kernels
    are on, the weight the same dtype with unit-stride rows (FP8 weights keep their own path:
    layers/quantization/fp8.py; float32 stays on cuBLAS, the exactness reference), and
    `SKINNY_TILES` names x's device and the weight's shape."""
    if not (
        triton_support.enabled_for(x)
        and x.dim() == 2
        and 2 <= x.shape[0] <= MAX_ROWS
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
        and weight.stride(1) == 1
    ):
        return None
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    return _device_tiles(x.device.index or 0).get((n, weight.shape[1], gated))


def skinny_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    tile: tuple[int, int, int, int],
    out_dtype: torch.dtype | None = None,
    gated: bool = False,
) -> torch.Tensor:
    """F.linear(x, weight, bias) for x of at most MAX_ROWS rows ([M, K]); weight [N, K]
    unit-stride rows; rounded to x's dtype, stored as `out_dtype` (default x's). `gated`:
    weight is [gate; up] and the result silu(gate) * up, N / 2 wide. `tile`: (features per
    program, K chunk, warps, pipeline stages), `skinny_tile`'s for the product (there is no
    default: a tile is chosen by measuring it in the step, and only `SKINNY_TILES` holds those).
    Each program keeps its stages' weight chunks in shared memory."""
    m, k = x.shape
    n = weight.shape[0]
    if m > MAX_ROWS or weight.shape[1] != k or weight.stride(1) != 1 or (gated and n % 2):
        raise ValueError(f"skinny_gemm needs <= {MAX_ROWS} rows, got {x.shape}, {weight.shape}")
    if gated:
        n //= 2
    block_n, block_k, num_warps, num_stages = tile
    x = x if x.stride(1) == 1 else x.contiguous()
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    _skinny_gemm_kernel[(triton.cdiv(n, block_n),)](
        x,
        weight,
        bias if bias is not None else weight,
        y,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        y.stride(0),
        HAS_BIAS=bias is not None,
        GATED=gated,
        EVEN_K=k % block_k == 0,
        BLOCK_M=MAX_ROWS,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        NUM_STAGES=num_stages,
        num_warps=num_warps,
    )
    return y
