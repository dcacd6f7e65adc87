"""Batch-1 projections of the 1B and 8B Llama shapes: cuBLAS (F.linear, torch.mv) against the
Triton GEMV (kernels/gemv.py) over a sweep of block shapes, each timed as CUDA graph replays
(as a decode step runs them), the weights coming from DRAM as in a decode step (l2_cold.py;
before 2026-12-02 projections smaller than L2 were timed partly from it). Prints microseconds
and the share of copy bandwidth."""

import itertools
import json
import sys

import torch
import torch.nn.functional as F
from l2_cold import copies, microseconds

from radixserve.kernels.gemv import gemv

SHAPES = {
    "1b.qkv": (3072, 2048),
    "1b.o": (2048, 2048),
    "1b.gate_up": (16384, 2048),
    "1b.down": (2048, 8192),
    "1b.lm_head": (128256, 2048),
    "8b.qkv": (6144, 4096),
    "8b.o": (4096, 4096),
    "8b.gate_up": (28672, 4096),
    "8b.down": (4096, 14336),
    "8b.lm_head": (128256, 4096),
}
BANDWIDTH = 4.25e12  # measured copy bandwidth of the H200 (docs/benchmarks.md)
CONFIGS = [
    (bn, bk, warps)
    for bn, bk, warps in itertools.product((1, 2, 4, 8, 16), (256, 512, 1024, 2048), (2, 4, 8))
    if bn * bk <= 8192
]


def measure(n: int, k: int) -> dict:
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    ref = F.linear(x.float(), w.float())
    weights = copies(w)
    row = {
        "floor_us": n * k * 2 / BANDWIDTH * 1e6,
        "cublas_linear": microseconds(lambda w: F.linear(x, w), weights),
        "cublas_mv": microseconds(lambda w: torch.mv(w, x[0]), weights),
    }
    best = None
    for bn, bk, warps in CONFIGS:
        if bk > k:
            continue
        y = gemv(x, w, None, bn, bk, warps)
        err = ((y.float() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, (n, k, bn, bk, warps, err)
        us = microseconds(lambda w, c=(bn, bk, warps): gemv(x, w, None, *c), weights)
        if best is None or us < best[0]:
            best = (us, bn, bk, warps)
    row["triton_best"] = best
    return row


results = {}
for name, (n, k) in SHAPES.items():
    row = results[name] = measure(n, k)
    us, bn, bk, warps = row["triton_best"]
    print(
        f"{name:12s} floor {row['floor_us']:7.1f} us  linear {row['cublas_linear']:7.1f}  "
        f"mv {row['cublas_mv']:7.1f}  triton {us:7.1f} (bn {bn} bk {bk} warps {warps})",
        flush=True,
    )
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(results, f, indent=1)
