"""Projections of 2-16 rows (small decode batches, a verify step's k + 1 positions) of the 1B
and 8B Llama shapes: cuBLAS (F.linear; gated: F.linear then the activation kernel) against
the skinny GEMM (kernels/skinny_gemm.py): a sweep of tiles at 5 rows (an 8B verify step at
k = 4), then its best tile, and the shipped one where the device's `SKINNY_TILES` names the
shape, at every row count; each timed as CUDA graph replays with the weights coming from DRAM
(l2_cold.py). Prints microseconds and the share of this machine's copy bandwidth; writes every
figure and the best tile per shape ("tiles": "NxKxGATED" -> tile) to OUT.json.

Then, at 5 rows, each product interleaved with a fused residual RMSNorm of the same rows (as a
step alternates products with small kernels), against the two timed alone: on an H100 the
skinny kernel's pairs came within 0.4 us of the two alone (2026-12-05 late evening), so a small
kernel after it costs nothing extra; the L1 / shared-memory split, once suspected, is not where
it lost time in the step (the dependent launch was).

Usage: python3 scripts/gpu/bench_skinny.py OUT.json
"""

import json
import sys

import torch
import torch.nn.functional as F
from l2_cold import copies, copy_bandwidth, microseconds

from radixserve.kernels import skinny_gemm as skinny_module
from radixserve.kernels.fused_ops import fused_add_rms_norm, silu_and_mul
from radixserve.kernels.skinny_gemm import skinny_gemm

# name: (output features, K, gated); a gated product's features are its two halves
SHAPES = {
    "8b.qkv": (6144, 4096, False),
    "8b.o": (4096, 4096, False),
    "8b.gate_up": (28672, 4096, True),
    "8b.down": (4096, 14336, False),
    "8b.lm_head": (128256, 4096, False),
    "1b.qkv": (3072, 2048, False),
    "1b.down": (2048, 8192, False),
}
TILES = [  # (features per program, K chunk, warps, stages)
    (32, 64, 4, 2),
    (32, 128, 4, 2),
    (32, 128, 4, 4),
    (32, 128, 4, 6),
    (32, 256, 4, 3),
    (32, 256, 4, 4),
    (64, 128, 4, 4),
    (64, 128, 4, 6),
    (64, 256, 4, 3),
    (128, 128, 4, 4),
]
ROWS = (2, 5, 8, 16)
SWEEP_ROWS = 5


BANDWIDTH = copy_bandwidth()  # this machine's: each product's floor is its bytes over it


def measure(n: int, k: int, gated: bool) -> dict:
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    weights = copies(w)
    half = n // 2 if gated else n
    row: dict = {"floor_us": n * k * 2 / BANDWIDTH * 1e6, "rows": {}}

    def cublas(x, w):
        y = F.linear(x, w)
        return silu_and_mul(y) if gated else y

    def ours(x, tile):
        return lambda w: skinny_gemm(x, w, None, tile, gated=gated)

    # the tile `linear` runs on this device (`SKINNY_TILES`), if any: cuBLAS otherwise
    shipped = skinny_module._device_tiles(0).get((half, k, gated))
    x5 = torch.randn(SWEEP_ROWS, k, dtype=torch.bfloat16, device="cuda")
    ref = cublas(x5.float(), w.float())
    sweep = {}
    for tile in TILES:
        try:
            y = skinny_gemm(x5, w, None, tile, gated=gated)
        except Exception as e:  # a tile past the shared memory: out of the sweep
            sweep[str(tile)] = repr(e)[:80]
            continue
        err = ((y.float() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, (n, k, tile, err)
        sweep[str(tile)] = microseconds(ours(x5, tile), weights)
    timed = {t: us for t, us in sweep.items() if isinstance(us, float)}
    best = min(timed, key=timed.get)
    row["sweep_5_rows"] = sweep
    row["best_tile"] = json.loads(best.replace("(", "[").replace(")", "]"))
    row["shipped_tile"] = list(shipped) if shipped else None
    labelled = {"best": tuple(row["best_tile"])} | ({"shipped": shipped} if shipped else {})
    # interleaved with a small kernel, as in a step: the pair against the two alone
    hidden = torch.randn(SWEEP_ROWS, 4096, dtype=torch.bfloat16, device="cuda")
    residual, norm_w = (
        torch.randn_like(hidden),
        torch.ones(4096, dtype=torch.bfloat16, device="cuda"),
    )

    def norm():
        fused_add_rms_norm(hidden, residual, norm_w, 1e-6)

    row["norm_alone_us"] = microseconds(lambda w: norm(), weights)
    row["cublas_with_norm_us"] = microseconds(lambda w: (cublas(x5, w), norm()), weights)
    for label, tile in labelled.items():
        run = ours(x5, tile)
        row[f"{label}_with_norm_us"] = microseconds(lambda w, run=run: (run(w), norm()), weights)
    for m in ROWS:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        row["rows"][m] = {"cublas_us": microseconds(lambda w, x=x: cublas(x, w), weights)} | {
            f"{label}_us": microseconds(ours(x, tile), weights) for label, tile in labelled.items()
        }
    return row


results = {}
tiles = {}
out_path = sys.argv[1] if len(sys.argv) > 1 else None
for name, (n, k, gated) in SHAPES.items():
    row = results[name] = measure(n, k, gated)
    tiles[f"{n // 2 if gated else n}x{k}x{int(gated)}"] = row["best_tile"]
    print(
        f"{name:11s} floor {row['floor_us']:6.1f} us; best tile at 5 rows {row['best_tile']}, "
        f"shipped {row['shipped_tile']}",
        flush=True,
    )
    alone, norm_us = row["rows"][SWEEP_ROWS], row["norm_alone_us"]
    labels = ["cublas", "best"] + (["shipped"] if row["shipped_tile"] else [])
    print(
        f"  5 rows then a norm ({norm_us:.1f} us alone): "
        + "  ".join(
            f"{label} {row[label + '_with_norm_us']:.1f} us (alone {alone[label + '_us'] + norm_us:.1f})"
            for label in labels
        ),
        flush=True,
    )
    for m, r in row["rows"].items():
        print(
            f"  {m:2d} rows: "
            + "  ".join(
                f"{label} {r[label + '_us']:7.1f} us ({row['floor_us'] / r[label + '_us']:4.0%})"
                for label in labels
            ),
            flush=True,
        )
    if out_path:  # after every shape: a run cut short keeps what it measured
        with open(out_path, "w") as f:
            json.dump({"bandwidth": BANDWIDTH, "shapes": results, "tiles": tiles}, f, indent=1)
