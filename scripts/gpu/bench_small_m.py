"""Projections of 2-16 rows, Llama-3-8B shapes: the small-M kernel (kernels/small_m.py, its
shipped tiles) against cuBLAS (F.linear; for gate_up F.linear then the activation kernel, what
the model ran before) and the bf16 bandwidth floor, at M = 2, 4, 8, 16; FP8 at M = 8
(weight-only small-M against the per-token quantization + torch._scaled_mm it replaced); then
bf16 and FP8 tile sweeps at M = 8 that propose small_m.block_config's tiles. Each timed as CUDA
graph replays with the weights coming from DRAM (l2_cold.py), as in a decode step; percentages
are of the measured copy bandwidth, as bench_gemv.py's.

PASS: the shipped tiles beat cuBLAS at M = 8 on every projection (the verify step's graph).
The verdict and its figures are printed and written first, the sweep after (OUT.json again
after each shape), so a stage cut short by its time limit still has them.
Usage: python3 scripts/gpu/bench_small_m.py [OUT.json] [--no-sweep]"""

import json
import sys

import torch
import torch.nn.functional as F
import triton
from l2_cold import copies, microseconds

from radixserve.kernels import fused_ops
from radixserve.kernels.small_m import block_config, small_m
from radixserve.layers.quantization.fp8 import quantize_per_token, quantize_rows

# name: (weight rows, K, gated)
SHAPES = {
    "8b.qkv": (6144, 4096, False),
    "8b.o": (4096, 4096, False),
    "8b.gate_up": (28672, 4096, True),
    "8b.down": (4096, 14336, False),
    "8b.lm_head": (128256, 4096, False),
}
ROWS = (2, 4, 8, 16)
BANDWIDTH = 4.25e12  # measured copy bandwidth of the H200 (docs/benchmarks.md)
# (weight rows a program, K chunk, warps, stages): around the shipped tiles; 64 rows a program
# is Hopper's wgmma (the dot's M at a warpgroup's 64)
SWEEP = [(rows, chunk, 4, 4) for rows in (16, 32, 64) for chunk in (128, 256, 512)]
SWEEP += [(16, 256, 4, 3), (32, 256, 4, 3), (16, 256, 8, 4), (16, 256, 2, 4), (16, 512, 4, 1)]
FP8_SWEEP = [(16, 512, 4, 4), (16, 1024, 4, 3), (16, 512, 2, 4), (32, 512, 4, 4), (16, 512, 8, 4)]
FP8_SWEEP += [(16, 256, 4, 4)]


def scaled_mm(x, values, scale, gated):
    """The FP8 path above 16 rows: activations quantized per token, FP8 x FP8."""
    q, x_scale = quantize_per_token(x)
    y = torch._scaled_mm(
        q, values.t(), scale_a=x_scale, scale_b=scale.view(1, -1), out_dtype=x.dtype
    )
    return fused_ops.silu_and_mul(y) if gated else y


def cublas(x, w, gated):
    y = F.linear(x, w)
    return fused_ops.silu_and_mul(y) if gated else y


def percent(floor_us: float, us: float) -> float:
    return round(100 * floor_us / us, 1)


def measure(n: int, k: int, gated: bool) -> dict:
    """The shipped tiles against cuBLAS at every M, and FP8 at M = 8."""
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    weights = copies(w)
    floor = n * k * 2 / BANDWIDTH * 1e6
    row = {"shipped": str(block_config(n // 2 if gated else n, k)), "floor_us": floor}
    row["by_rows"] = {}
    for m in ROWS:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        ref = cublas(x.float(), w.float(), gated)
        err = ((small_m(x, w, gated=gated).float() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, (n, k, m, err)
        ours = microseconds(lambda w, x=x: small_m(x, w, gated=gated), weights)
        theirs = microseconds(lambda w, x=x: cublas(x, w, gated), weights)
        row["by_rows"][m] = {
            "small_m_us": ours,
            "cublas_us": theirs,
            "small_m_pct": percent(floor, ours),
            "cublas_pct": percent(floor, theirs),
        }
        if gated:  # the product alone, without the activation's launch
            product = microseconds(lambda w, x=x: F.linear(x, w), weights)
            row["by_rows"][m]["cublas_product_us"] = product
    if n < 65536:  # the LM head stays bf16 under --quantization fp8
        del weights
        values, scale = quantize_rows(w)
        fp8_weights = copies(values, scale)
        x = torch.randn(8, k, dtype=torch.bfloat16, device="cuda")
        ours = microseconds(lambda v, s: small_m(x, v, gated=gated, scale=s), fp8_weights)
        theirs = microseconds(lambda v, s: scaled_mm(x, v, s, gated), fp8_weights)
        row["fp8_m8"] = {
            "small_m_us": ours,
            "scaled_mm_us": theirs,
            "small_m_pct": percent(floor / 2, ours),
        }
    return row


def best_tile(run, configs, floor: float) -> dict:
    """`run(config)`'s time for each config (those whose stages fit in shared memory), and the
    best: [config, us, % of the copy bandwidth]."""
    tiles = {}
    for config in dict.fromkeys(configs):
        try:
            tiles[str(config)] = run(config)
        except triton.runtime.errors.OutOfResources:
            continue
    best = min(tiles, key=tiles.get)
    return {"us": tiles, "best": [best, tiles[best], percent(floor, tiles[best])]}


def sweep(n: int, k: int, gated: bool) -> dict:
    """SWEEP's tiles at M = 8 (the shipped one first), and FP8_SWEEP's for the FP8 weight."""
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    x = torch.randn(8, k, dtype=torch.bfloat16, device="cuda")
    width, floor = n // 2 if gated else n, n * k * 2 / BANDWIDTH * 1e6
    weights = copies(w)
    result = {
        "bf16": best_tile(
            lambda c: microseconds(lambda w: small_m(x, w, gated=gated, config=c), weights),
            [block_config(width, k), *SWEEP],
            floor,
        )
    }
    if n < 65536:
        del weights
        fp8_weights = copies(*quantize_rows(w))
        result["fp8"] = best_tile(
            lambda c: microseconds(
                lambda v, s: small_m(x, v, gated=gated, scale=s, config=c), fp8_weights
            ),
            [block_config(width, k, fp8=True), *FP8_SWEEP],
            floor / 2,
        )
    return result


def main() -> None:
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    results: dict = {}

    def save() -> None:
        if paths:
            with open(paths[0], "w") as f:
                json.dump(results, f, indent=1)

    lost = []
    for name, (n, k, gated) in SHAPES.items():
        row = results[name] = measure(n, k, gated)
        torch.cuda.empty_cache()
        for m, r in row["by_rows"].items():
            print(
                f"{name:11s} M={m:<2d} floor {row['floor_us']:6.1f} us  small_m "
                f"{r['small_m_us']:6.1f} ({r['small_m_pct']:5.1f}%)  cublas {r['cublas_us']:6.1f} "
                f"({r['cublas_pct']:5.1f}%)"
                + (f"  (product alone {r['cublas_product_us']:6.1f})" if gated else ""),
                flush=True,
            )
        if "fp8_m8" in row:
            f = row["fp8_m8"]
            print(
                f"{name:11s} M=8  fp8: small_m {f['small_m_us']:6.1f} us ({f['small_m_pct']}% of "
                f"the FP8 floor)  quantize+scaled_mm {f['scaled_mm_us']:6.1f}",
                flush=True,
            )
        m8 = row["by_rows"][8]
        if m8["small_m_us"] >= m8["cublas_us"]:
            lost.append(name)
    results["pass"] = not lost
    save()
    losses = f" (not on {', '.join(lost)})" if lost else ""
    verdict = "FAIL" if lost else "PASS"
    print(f"bench {verdict}: small_m beats cuBLAS at M=8 on every projection{losses}", flush=True)
    if "--no-sweep" in sys.argv:
        return
    for name, (n, k, gated) in SHAPES.items():
        results[name]["sweep_m8"] = tiles = sweep(n, k, gated)
        torch.cuda.empty_cache()
        save()
        fp8 = f", fp8 best {tiles['fp8']['best']}" if "fp8" in tiles else ""
        print(
            f"{name:11s} M=8  tiles: shipped {results[name]['shipped']}, best {tiles['bf16']['best']}{fp8}"
        )


if __name__ == "__main__":
    main()
