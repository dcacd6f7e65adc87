"""MLA decode attention against its limits: the Triton MLA decode kernel
(kernels/mla_decode.py) over the latent pool at 4k and 32k context, DeepSeek-V2-Lite's 16 heads
and V3's 128, batch 1, 8 and 64, beside the torch reference (`mla_decode_native`) as the peer.

Decode attention must read every latent row of every request once (576 bf16 values a token)
plus the queries, and write the outputs; the bandwidth limit is those bytes over the device's
measured copy bandwidth (read + write, as `bench latency` measures it; ~4.3 TB/s on an H200).
At 128 heads the products, 2 x heads x (576 + 512) FLOPs a token, take about as long at the
dense bf16 peak (PEAK_BF16_FLOPS) as the reads at the copy bandwidth, so each case also says
what fraction of that peak it reached. Each timed call runs the kernel over enough layers'
pools that they cannot sit in L2 (a 4k context is 4.7 MB a layer, L2 is 50 MB), captured in
one CUDA graph, as a decode step runs them. Every case checks the kernel against torch.

After the main cases a sweep times alternative tile shapes (CANDIDATES) at 32k context,
batch 8 and 64, each checked against torch; a candidate starts only while the run is under
SWEEP_BEFORE_S (each compiles the kernel afresh: a few seconds).

Usage: python3 scripts/gpu/bench_mla.py OUT.json  (prints one `===` line per case, ~30-50 s)
Without CUDA (a dry run): TRITON_INTERPRET=1, tiny shapes, no graph, timings meaningless.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

CUDA = __import__("torch").cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from radixserve.kernels.mla_decode import (  # noqa: E402
    MLADecodeConfig,
    default_config,
    mla_decode_fwd,
    num_splits,
)
from radixserve.layers.mla import mla_decode_native, num_sms  # noqa: E402

LATENT, ROPE = (512, 64) if CUDA else (32, 16)
DEVICE = "cuda" if CUDA else "cpu"
DTYPE = torch.bfloat16 if CUDA else torch.float32
COLD_BYTES = 512 << 20  # the pools of one timed call, together: ten times L2
PEAK_BF16_FLOPS = 989e12  # H200 SXM, dense bf16 tensor cores
SWEEP_BEFORE_S = 40.0  # a sweep candidate starts only this early: the run stays under 60 s
# (block_h, block_n, num_warps, num_stages) tried beside the default, per head count
CANDIDATES = {
    16: [(16, 32, 4, 2), (16, 64, 8, 2), (64, 32, 8, 2)],
    128: [(64, 32, 8, 2), (64, 64, 8, 1), (16, 32, 8, 2)],  # the last: the old kernel's tile
}


def copy_bandwidth() -> float:
    if not CUDA:
        return 1.0
    a = torch.empty(1 << 30, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(10):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    return 2 * a.numel() * 2 * 10 / (start.elapsed_time(end) / 1e3)


def timed(fn: Callable[[], None], iters: int) -> float:
    """Seconds per call: replays of one captured graph of `fn` on CUDA, wall time elsewhere."""
    fn()
    if not CUDA:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


class Shape:
    """One (batch, context, heads) case: its pools (enough layers to leave L2 cold), page table
    (each request's slots a random permutation of the pool) and absorbed query."""

    def __init__(self, bs: int, context: int, heads: int) -> None:
        width = LATENT + ROPE
        tokens = bs * context
        self.bs, self.context, self.heads = bs, context, heads
        self.layer_bytes = tokens * width * DTYPE.itemsize
        self.layers = max(1, COLD_BYTES // self.layer_bytes) if CUDA else 1
        self.pools = [
            torch.randn(tokens + 1, 1, width, device=DEVICE, dtype=DTYPE)
            for _ in range(self.layers)
        ]
        slots = torch.randperm(tokens, device=DEVICE).to(torch.int32) + 1
        self.req_to_token = slots.view(bs, context)
        self.rows = torch.arange(bs, device=DEVICE)
        self.lens = torch.full((bs,), context, device=DEVICE)
        self.q = torch.randn(bs, heads, width, device=DEVICE, dtype=DTYPE)
        self.scale, self.sms = 192**-0.5, num_sms(torch.device(DEVICE))
        self.reference = self.native(self.pools[0])

    def kernel(self, pool: torch.Tensor, config: MLADecodeConfig) -> torch.Tensor:
        q_latent, q_rope = self.q[..., :LATENT], self.q[..., LATENT:]
        return mla_decode_fwd(
            q_latent,
            q_rope,
            pool,
            self.req_to_token,
            self.rows,
            self.lens,
            self.scale,
            self.sms,
            config,
        )

    def native(self, pool: torch.Tensor) -> torch.Tensor:
        return mla_decode_native(
            self.q,
            pool,
            self.req_to_token,
            self.rows,
            self.lens,
            self.context,
            LATENT,
            self.scale,
        )

    def bytes_moved(self) -> int:
        """A layer's latent rows and queries read, outputs written."""
        q_bytes = self.q.numel() * self.q.element_size()
        return self.layer_bytes + q_bytes + self.bs * self.heads * LATENT * DTYPE.itemsize

    def flops(self) -> int:
        return 2 * self.bs * self.heads * self.context * (2 * LATENT + ROPE)

    def time_kernel(self, config: MLADecodeConfig) -> tuple[float, float]:
        """Seconds a layer, and the relative error against torch on the first pool."""
        out = self.kernel(self.pools[0], config)
        ref = self.reference.float()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        seconds = timed(lambda: [self.kernel(p, config) for p in self.pools], 20)
        return seconds / self.layers, err

    def time_native(self) -> float:
        if not CUDA:
            return float("nan")
        return timed(lambda: [self.native(p) for p in self.pools], 3) / self.layers

    def release(self) -> None:
        self.pools.clear()
        if CUDA:
            torch.cuda.empty_cache()


def measure(shape: Shape, config: MLADecodeConfig, bandwidth: float, torch_s: float) -> dict:
    seconds, err = shape.time_kernel(config)
    moved = shape.bytes_moved()
    return {
        "bs": shape.bs,
        "context": shape.context,
        "heads": shape.heads,
        "config": vars(config),
        "splits": num_splits(shape.bs, shape.heads, shape.sms, config.block_h),
        "layers_per_call": shape.layers,
        "us_per_layer": seconds * 1e6,
        "bytes_per_layer": moved,
        "floor_us": moved / bandwidth * 1e6,
        "fraction_of_bandwidth": moved / seconds / bandwidth,
        "tflops": shape.flops() / seconds / 1e12,
        "fraction_of_bf16_peak": shape.flops() / seconds / PEAK_BF16_FLOPS,
        "torch_us_per_layer": torch_s * 1e6,
        "rel_err_vs_torch": err,
    }


def report(result: dict, tag: str) -> None:
    c = result["config"]
    print(
        f"=== MLA decode {tag}bs {result['bs']} ctx {result['context']} heads "
        f"{result['heads']}: {result['us_per_layer']:.1f} us a layer (floor "
        f"{result['floor_us']:.1f} us) = {100 * result['fraction_of_bandwidth']:.1f}% of the "
        f"copy bandwidth, {result['tflops']:.0f} TFLOPS "
        f"({100 * result['fraction_of_bf16_peak']:.0f}% of bf16 peak); torch "
        f"{result['torch_us_per_layer']:.1f} us; rel err {result['rel_err_vs_torch']:.1e} "
        f"(block_h {c['block_h']}, block_n {c['block_n']}, warps {c['num_warps']}, stages "
        f"{c['num_stages']}, {result['splits']} splits)",
        flush=True,
    )


def write(bandwidth: float, cases: list[dict], sweep: list[dict]) -> None:
    with open(sys.argv[1], "w") as f:
        json.dump({"copy_bytes_per_s": bandwidth, "cases": cases, "sweep": sweep}, f, indent=2)


def main() -> None:
    began = time.perf_counter()
    bandwidth = copy_bandwidth()
    contexts = (4096, 32768) if CUDA else (100,)
    batches = (1, 8, 64) if CUDA else (1, 2)
    cases, sweep = [], []
    for heads in (16, 128):
        for context in contexts:
            for bs in batches:
                shape = Shape(bs, context, heads)
                result = measure(
                    shape, default_config(heads, DTYPE), bandwidth, shape.time_native()
                )
                report(result, "")
                cases.append(result)
                shape.release()
    write(bandwidth, cases, sweep)  # kept if the sweep is cut off from outside
    sweep_shapes = [(heads, bs) for heads in CANDIDATES for bs in batches[1:]]
    for heads, bs in sweep_shapes:
        shape = Shape(bs, contexts[-1], heads)
        for candidate in CANDIDATES[heads]:
            if time.perf_counter() - began < SWEEP_BEFORE_S:
                result = measure(shape, MLADecodeConfig(*candidate), bandwidth, float("nan"))
                report(result, "sweep ")
                sweep.append(result)
        shape.release()
    write(bandwidth, cases, sweep)
    print(f"=== done in {time.perf_counter() - began:.0f} s", flush=True)


if __name__ == "__main__":
    main()
