"""Batch-1 FP8 projections of the Llama-3-8B shape, each timed as CUDA graph replays: the
FP8 GEMV (weight-only, kernels/gemv.py with channel scales) over a sweep of block configs,
against torch._scaled_mm at M = 1 (with its per-token activation quantization) and against the
bf16 GEMV the unquantized model runs. gate_up runs gated, as the model runs it. Proposes the
batch-1 tiles and pipeline stages (kernels/gemv.py's block_config; a pick is kept only where the
decode step measures its gain: alone is not as in a step, decode_timeline.py); prints
microseconds and the share of copy bandwidth of the FP8 bytes. The weights come from DRAM, as
in a decode step (l2_cold.py; before 2026-12-02 qkv and o were timed partly from L2).
Usage: python3 scripts/gpu/bench_fp8_gemv.py [--grid] [OUT.json] (--grid: the sweep below,
about 140 configs, instead of 7)."""

import json
import sys

import torch
import triton
from l2_cold import copies, microseconds

from radixserve.kernels.gemv import block_config, gemv
from radixserve.layers.quantization.fp8 import quantize_per_token, quantize_rows

SHAPES = {
    "8b.qkv": (6144, 4096),
    "8b.o": (4096, 4096),
    "8b.gate_up": (28672, 4096),
    "8b.down": (4096, 14336),
}
BANDWIDTH = 4.25e12  # measured copy bandwidth of the H200 (docs/benchmarks.md)
# (rows, K chunk, warps, pipeline stages; 1: the plain loop)
FP8_CONFIGS = [
    (2, 512, 2, 1),
    (2, 1024, 2, 1),
    (4, 1024, 4, 1),
    (8, 1024, 4, 1),
    (4, 1024, 4, 3),
    (8, 1024, 4, 3),
    (8, 512, 4, 3),
]
if "--grid" in sys.argv:  # every tile whose accumulator keeps 8-128 floats a thread, each
    sys.argv.remove("--grid")  # plain and pipelined where its stages fit in 160 KB of smem
    FP8_CONFIGS = [
        (rows, chunk, warps, stages)
        for rows in (2, 4, 8, 16)
        for chunk in (512, 1024, 2048)
        for warps in (1, 2, 4, 8)
        for stages in (1, 2, 3, 4)
        if 8 <= rows * chunk // (32 * warps) <= 128
        and (stages == 1 or stages * (2 * rows + 2) * chunk <= 160 << 10)
    ]


def scaled_mm(x, values, scale):
    q, x_scale = quantize_per_token(x)
    return torch._scaled_mm(
        q, values.t(), scale_a=x_scale, scale_b=scale.view(1, -1), out_dtype=x.dtype
    )


def measure(n: int, k: int, gated: bool) -> dict:
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    values, scale = quantize_rows(w)
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    shipped = block_config(n, k, fp8=True)
    bf16 = block_config(n, k)
    fp8_weights, bf16_weights = copies(values, scale), copies(w)
    row = {
        "shipped": str(shipped),
        "fp8_floor_us": n * k / BANDWIDTH * 1e6,
        "bf16_gemv_us": microseconds(lambda w: gemv(x, w, None, *bf16, gated=gated), bf16_weights),
        "fp8_scaled_mm_us": microseconds(lambda v, s: scaled_mm(x, v, s), fp8_weights),
        "fp8_gemv_us": {},
    }
    for config in dict.fromkeys([shipped, *FP8_CONFIGS]):
        run = lambda v, s, c=config: gemv(x, v, None, *c, gated=gated, scale=s)  # noqa: E731
        try:
            row["fp8_gemv_us"][str(config)] = microseconds(run, fp8_weights)
        except triton.runtime.errors.OutOfResources as error:  # its stages' shared memory
            row.setdefault("fp8_gemv_failed", {})[str(config)] = str(error)[:200]
    return row


results = {}
for name, (n, k) in SHAPES.items():
    row = measure(n, k, gated=name.endswith("gate_up"))
    results[name] = row
    fp8 = row["fp8_gemv_us"][row["shipped"]]
    best = min(row["fp8_gemv_us"].items(), key=lambda kv: kv[1])
    print(
        f"=== {name:11s} fp8 floor {row['fp8_floor_us']:6.1f} us | fp8 gemv {fp8:6.1f} "
        f"({100 * row['fp8_floor_us'] / fp8:4.1f}% BW; best {best[1]:6.1f} at {best[0]}) | "
        f"scaled_mm {row['fp8_scaled_mm_us']:6.1f} | bf16 gemv {row['bf16_gemv_us']:6.1f}",
        flush=True,
    )
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(results, f, indent=1)
