"""One MoE layer at decode sizes: the routed GEMV (kernels/moe_gemv.py) against the grouped
GEMMs (kernels/fused_moe.py, `gemv=False`) and the floor (the routed experts' bytes over the
copy bandwidth), at the Qwen3-30B-A3B, gpt-oss-20b (biases, clamped SwiGLU) and
DeepSeek-V2-Lite shapes, 1 to 8 tokens; then, at batch 1, FP8 experts (Qwen3) and MXFP4 ones
(gpt-oss), and a sweep of each GEMV kernel's tiles (`GemvTiles`) alone.

Timed as CUDA graph replays over E / top_k routings that each reach other experts, so a pass
finds its experts in DRAM, not in L2, as a decode step does (a layer's experts are 1.1-1.6 GB;
the routed ones 25-200 MB). The routing itself is outside the timing: both paths share it.
Prints `===` lines (PASS/FAIL: the GEMV equals the grouped GEMMs within bf16 and is faster at
batch 1) and writes JSON to argv[1]."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import torch
from triton.testing import do_bench_cudagraph

from radixserve.kernels.fp8_quant import quantize_rows
from radixserve.kernels.fused_moe import fused_moe
from radixserve.kernels.moe_gemv import (
    GemvTiles,
    down_gemv,
    gate_up_gemv,
    uses_moe_gemv,
)
from radixserve.layers.quantization.mxfp4 import quantize_mxfp4

DEVICE = "cuda"  # (a CPU dry run of the logic under the interpreter sets "cpu")
BANDWIDTH = 4.25e12  # measured copy bandwidth of the H200 (docs/benchmarks.md)
# experts, top_k, hidden, moe intermediate, expert biases (gpt-oss: and the clamped SwiGLU)
SHAPES = {
    "qwen3-30b-a3b": (128, 8, 2048, 768, False),
    "gpt-oss-20b": (32, 4, 2880, 2880, True),
    "deepseek-v2-lite": (64, 6, 2048, 1408, False),
}
TOKENS = (1, 2, 4, 8)
# (rows per program, K chunk, warps) of each kernel, timed alone at batch 1 (the plain K loop)
# beside the shipped tiles (`GemvTiles.for_intermediate`), the fastest three then pipelined too. Compiled for Hopper, the first guesses (the first of
# each list) held 40 (gate/up) and 98 (down, top 8) registers a thread, no spills
GATE_UP_TILES = [
    (1, 1024, 4),
    (2, 1024, 4),
    (1, 2048, 4),
    (1, 512, 4),
    (1, 512, 2),
    (2, 512, 4),
    (4, 512, 8),
]
DOWN_TILES = [  # the K chunk is per expert: a tile holds all the slots' chunks
    (2, 256, 4),
    (1, 256, 4),
    (1, 256, 2),
    (1, 128, 4),
    (1, 128, 2),
    (2, 128, 4),
    (4, 128, 4),
    (1, 512, 4),
    (2, 512, 8),
    (4, 256, 8),
]


class Layer:
    """One MoE layer's experts (random, in the given format) and routings for `tokens`."""

    def __init__(self, shape: str, fmt: str = "bf16") -> None:
        experts, self.top_k, hidden, inter, biased = SHAPES[shape]
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        bf = torch.bfloat16

        def randn(*size: int, std: float) -> torch.Tensor:
            return (torch.randn(*size, generator=gen, device=DEVICE) * std).to(bf)

        self.w13 = randn(experts, 2 * inter, hidden, std=hidden**-0.5)
        self.w2 = randn(experts, hidden, inter, std=inter**-0.5)
        self.extra: dict = {"activation": "swiglu_oai" if biased else "silu"}
        if biased:
            self.extra |= {
                "w13_bias": randn(experts, 2 * inter, std=0.1),
                "w2_bias": randn(experts, hidden, std=0.1),
                "swiglu": (1.702, 7.0),
            }
        if fmt != "bf16":
            quantize = quantize_rows if fmt == "fp8" else _mxfp4_by_expert
            (self.w13, s13), (self.w2, s2) = quantize(self.w13), quantize(self.w2)
            self.extra |= {"w13_scale": s13, "w2_scale": s2}
        self.experts, self.hidden, self.inter = experts, hidden, inter
        tensors = [self.w13, self.w2] + [v for v in self.extra.values() if torch.is_tensor(v)]
        self.expert_bytes = sum(t.numel() * t.element_size() for t in tensors) // experts
        self.gate_up_bytes = self.w13[0].numel() * self.w13.element_size()
        self.down_bytes = self.w2[0].numel() * self.w2.element_size()
        self.use = torch.zeros(2, dtype=torch.int64, device=DEVICE)

    def routings(self, tokens: int) -> list[tuple[torch.Tensor, ...]]:
        """experts / top_k replicas of (x, weights, ids): at batch 1 disjoint expert sets that
        together cover every expert once; for more tokens random ones."""
        gen = torch.Generator().manual_seed(tokens)
        count = max(2, self.experts // self.top_k)
        perm = torch.randperm(self.experts, generator=gen)
        replicas = []
        for r in range(count):
            if tokens == 1:
                ids = perm[r * self.top_k : (r + 1) * self.top_k].view(1, -1)
            else:
                draws = [torch.randperm(self.experts, generator=gen) for _ in range(tokens)]
                ids = torch.stack([d[: self.top_k] for d in draws])
            weights = torch.softmax(torch.randn(tokens, self.top_k, generator=gen), -1)
            x = torch.randn(tokens, self.hidden, generator=gen).to(torch.bfloat16)
            replicas.append((x.to(DEVICE), weights.to(DEVICE), ids.to(DEVICE, torch.int32)))
        return replicas

    def run(self, replica: tuple[torch.Tensor, ...], gemv: bool) -> torch.Tensor:
        x, weights, ids = replica
        return fused_moe(x, self.w13, self.w2, weights, ids, self.use, gemv=gemv, **self.extra)

    def gate_up(self, replica: tuple[torch.Tensor, ...], tiles: GemvTiles) -> torch.Tensor:
        x, _, ids = replica
        e = self.extra
        scale, bias, swiglu = e.get("w13_scale"), e.get("w13_bias"), e.get("swiglu", (1.702, 7.0))
        return gate_up_gemv(x, self.w13, ids, self.use, e["activation"], scale, bias, swiglu, tiles)

    def down(self, replica: tuple[torch.Tensor, ...], tiles: GemvTiles) -> torch.Tensor:
        acts, weights, ids = replica
        scale, bias = self.extra.get("w2_scale"), self.extra.get("w2_bias")
        return down_gemv(acts, self.w2, weights, ids, scale, bias, tiles)

    def floor_us(self, replicas: list[tuple[torch.Tensor, ...]]) -> float:
        """The distinct experts a pass reads, over the copy bandwidth."""
        distinct = sum(int(torch.unique(r[2]).numel()) for r in replicas) / len(replicas)
        return distinct * self.expert_bytes / BANDWIDTH * 1e6


def _mxfp4_by_expert(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_mxfp4 an expert at a time (its temporaries are many times the weight)."""
    parts = [quantize_mxfp4(w) for w in weight]
    return torch.stack([b.flatten(-2) for b, _ in parts]), torch.stack([s for _, s in parts])


def microseconds(run: Callable[[tuple], object], replicas: list[tuple]) -> float:
    return do_bench_cudagraph(lambda: [run(r) for r in replicas]) * 1e3 / len(replicas)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def paths(layer: Layer, name: str, tokens_list: tuple[int, ...]) -> dict:
    rows = {}
    for tokens in tokens_list:
        replicas = layer.routings(tokens)
        err = relative_error(layer.run(replicas[0], True), layer.run(replicas[0], False))
        gemv_us = microseconds(lambda r: layer.run(r, True), replicas)
        grouped_us = microseconds(lambda r: layer.run(r, False), replicas)
        floor = layer.floor_us(replicas)
        rows[tokens] = {
            "gemv_us": gemv_us,
            "grouped_us": grouped_us,
            "floor_us": floor,
            "gemv_of_bandwidth": floor / gemv_us,
            "grouped_of_bandwidth": floor / grouped_us,
            "gemv_vs_grouped_rel_err": err,
            "fused_moe_takes_gemv": uses_moe_gemv(tokens, layer.top_k),
        }
        ok = err < 1e-2 and (tokens > 1 or gemv_us < grouped_us)
        print(
            f"=== {name} T={tokens}: gemv {gemv_us:7.1f} us ({100 * floor / gemv_us:4.1f}% of bw)"
            f"  grouped {grouped_us:7.1f} us ({100 * floor / grouped_us:4.1f}%)  floor"
            f" {floor:6.1f} us  err {err:.1e}  fused_moe takes"
            f" {'gemv' if uses_moe_gemv(tokens, layer.top_k) else 'grouped'}"
            f"  {'PASS' if ok else 'FAIL'}",
            flush=True,
        )
    return rows


TILE_FIELDS = ("rows", "k", "warps", "stages")


def tiles_fields(kernel: str, tile: tuple[int, ...]) -> dict[str, int]:
    """`GemvTiles` fields of one kernel's (rows, K, warps, stages)."""
    return {f"{kernel}_{field}": v for field, v in zip(TILE_FIELDS, tile, strict=True)}


def time_tiles(kernel: str, run, inputs: list, candidates: list, timings: dict) -> None:
    """Each candidate tile of `kernel` not timed yet, alone over `inputs`, into `timings`."""
    for tile in candidates:
        if tile not in timings:
            tiles = GemvTiles(**tiles_fields(kernel, tile))
            timings[tile] = microseconds(lambda r, t=tiles: run(r, t), inputs)


def tile_sweep(layer: Layer, name: str) -> dict:
    """Each kernel alone at batch 1 over its tile candidates, against its bytes' floor; then
    the three fastest again with their K loop software-pipelined (2 and 3 stages); prints the
    best of each as the `GemvTiles` to take."""
    replicas = layer.routings(1)
    shipped = GemvTiles.for_intermediate(layer.inter)
    with_acts = [(layer.gate_up(r, shipped), r[1], r[2]) for r in replicas]
    kernels = {
        "gate_up": (GATE_UP_TILES, layer.gate_up, replicas, layer.gate_up_bytes),
        "down": (DOWN_TILES, layer.down, with_acts, layer.down_bytes),
    }
    result: dict = {}
    best_tiles = {}
    for kernel, (listed, run, inputs, nbytes) in kernels.items():
        ours = tuple(getattr(shipped, f"{kernel}_{field}") for field in TILE_FIELDS)
        timings: dict[tuple[int, ...], float] = {}
        time_tiles(kernel, run, inputs, [ours] + [(*t, 1) for t in listed], timings)
        fastest = sorted(timings, key=timings.get)[:3]
        pipelined = [(*t[:3], stages) for t in fastest for stages in (2, 3)]
        time_tiles(kernel, run, inputs, pipelined, timings)
        floor = layer.top_k * nbytes / BANDWIDTH * 1e6
        best = min(timings, key=timings.get)
        best_tiles |= tiles_fields(kernel, best)
        result[kernel] = {"floor_us": floor} | {
            "x".join(map(str, t)): us for t, us in timings.items()
        }
        print(
            f"=== {name} {kernel} tiles (rows, K, warps, stages): shipped {ours}"
            f" {timings[ours]:6.1f} us ({100 * floor / timings[ours]:4.1f}% of bw), best"
            f" {best} {timings[best]:6.1f} us ({100 * floor / timings[best]:4.1f}%)",
            flush=True,
        )
    print(f"=== {name} best: GemvTiles({', '.join(f'{k}={v}' for k, v in best_tiles.items())})")
    return result


def main() -> None:
    results: dict = {}
    for shape in SHAPES:
        layer = Layer(shape)
        results[shape] = {"bf16": paths(layer, shape, TOKENS), "tiles": tile_sweep(layer, shape)}
        del layer
        torch.cuda.empty_cache()
    for shape, fmt in (("qwen3-30b-a3b", "fp8"), ("gpt-oss-20b", "mxfp4")):
        layer = Layer(shape, fmt)
        results[shape][fmt] = paths(layer, f"{shape} {fmt}", (1,))
        del layer
        torch.cuda.empty_cache()
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
