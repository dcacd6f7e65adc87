"""GEMV tiles chosen in the decode step, not alone: for each projection of the Llama-3-8B shape,
each candidate (rows, K chunk, warps, stages) replaces `block_config`'s pick for that projection
only, the batch-1 graph is captured again, and its replays are timed beside the shipped tiles'.

A tile's time alone (bench_fp8_gemv.py, bench_gemv.py) is not its time in the step: there each
GEMV overlaps the kernel before it and the one after through PDL, and on 2026-12-02 the FP8
down projection's best tile alone (15.5 us against 17.6) took 19.6 us in the step against 17.4.

Each candidate's graph is timed in blocks of replays alternating with the shipped tiles' graph
(the machine drifts); it prints the median difference in microseconds a step (negative:
faster). About 5 s a candidate: one FP8 or bf16 pass of 36 takes 3-4 minutes.

Usage: python3 scripts/gpu/step_tiles.py [fp8|none] [OUT.json]
  (TILES="[(16, 1024, 2, 3), ...]" replaces the candidates below)
"""

from __future__ import annotations

import ast
import json
import os
import statistics
import sys
from collections.abc import Callable

import torch
from decode_worker import decode_worker

import radixserve.kernels.gemv as gemv_module
import radixserve.layers.quantization.fp8 as fp8_module
from radixserve.bench.latency import run_batch

Tile = tuple[int, int, int, int]
PROJECTIONS = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
}
# Round 2 (2026-12-02 09:54 UTC; none beat the picks by 5 us), around round 1's picks (qkv
# (8, 512, 2, 4), o and down (8, 1024, 4, 3), gate_up (8, 1024, 2, 3)): more rows, warps,
# stages and longer chunks.
# Round 1 (09:45) tried the best tiles of bench_fp8_gemv.py --grid alone and the plain ones:
# (2, 1024, 1, 1), (2, 512, 2, 1), (2, 2048, 2, 1), (8, 1024, 2, 3), (8, 512, 1, 3),
# (4, 1024, 1, 2), (4, 512, 1, 4), (8, 512, 2, 4), (4, 512, 2, 3), (8, 1024, 4, 3).
CANDIDATES: list[Tile] = [
    (8, 512, 2, 4),
    (8, 1024, 2, 3),
    (8, 1024, 4, 3),
    (16, 1024, 4, 3),
    (16, 512, 4, 4),
    (8, 1024, 4, 4),
    (8, 2048, 4, 2),
    (8, 1024, 8, 3),
    (16, 1024, 8, 3),
    (8, 512, 4, 4),
    (4, 1024, 2, 4),
    (8, 512, 2, 6),
]
if "TILES" in os.environ:
    CANDIDATES = ast.literal_eval(os.environ["TILES"])
BLOCKS, REPLAYS = 5, 50

quantization = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "none" else None
out_path = sys.argv[2] if len(sys.argv) > 2 else None
fp8 = quantization == "fp8"
decode = decode_worker("random:llama-3-8b", quantization)
shipped = gemv_module.block_config


def capture(pick: Callable[..., Tile]) -> torch.cuda.CUDAGraph:
    """The batch-1 step captured with `pick` as block_config; then a real 512-token request's
    decode inputs are left in the graphs' shared input buffer (a capture leaves padding rows)."""
    gemv_module.block_config = fp8_module.block_config = pick
    decode.runner.cuda_graph_runner.capture()
    graph = decode.runner.cuda_graph_runner.graphs[1]
    run_batch(decode.worker, decode.cache, 1, 512, 4, decode.vocab)
    return graph


def block_us(graph: torch.cuda.CUDAGraph) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / REPLAYS


def replacing(shape: tuple[int, int], tile: Tile) -> Callable[..., Tile]:
    def pick(n: int, k: int, fp8: bool = False) -> Tile:
        return tile if (n, k) == shape else shipped(n, k, fp8)

    return pick


results: dict = {"quantization": quantization or "bf16", "projections": {}}
base = capture(shipped)  # kept: every graph reads the same input buffer and KV pool
results["shipped_step_us"] = statistics.median(block_us(base) for _ in range(BLOCKS))
print(f"=== {results['quantization']}: shipped tiles {results['shipped_step_us']:.1f} us a step")
for name, shape in PROJECTIONS.items():
    row = results["projections"][name] = {"shipped": str(shipped(*shape, fp8)), "delta_us": {}}
    for tile in CANDIDATES:
        if tile == shipped(*shape, fp8):
            continue
        graph = capture(replacing(shape, tile))
        # candidate and shipped blocks alternate, so the machine's drift cancels
        deltas = [block_us(graph) - block_us(base) for _ in range(BLOCKS)]
        row["delta_us"][str(tile)] = statistics.median(deltas)
        print(f"  {name:8s} {tile!s:18s} {row['delta_us'][str(tile)]:+7.1f} us a step", flush=True)
if out_path:
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)
