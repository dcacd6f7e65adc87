"""MLA decode attention against its bandwidth limit: the Triton MLA decode kernel
(kernels/mla_decode.py) over the latent pool at 4k and 32k context, DeepSeek-V2-Lite's 16 heads
and V3's 128, batch 1 and 8, beside the torch reference (`mla_decode_native`) as the peer.

Decode attention must read every latent row of every request once (576 bf16 values a token);
the limit is those bytes over the device's measured copy bandwidth (read + write, as
`bench latency` measures it). Each timed call runs the kernel over enough layers' pools that
they cannot sit in L2 (a 4k context is 4.7 MB a layer, L2 is 50 MB), captured in one CUDA
graph, as a decode step runs them.

Usage: python3 scripts/gpu/bench_mla.py OUT.json  (prints one `===` line per case)
Without CUDA (a dry run): TRITON_INTERPRET=1, tiny shapes, no graph, timings meaningless.
"""

from __future__ import annotations

import json
import os
import sys
import time

CUDA = __import__("torch").cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from radixserve.kernels.mla_decode import mla_decode_fwd, num_splits  # noqa: E402
from radixserve.layers.mla import mla_decode_native, num_sms  # noqa: E402

LATENT, ROPE = (512, 64) if CUDA else (32, 16)
DEVICE = "cuda" if CUDA else "cpu"
DTYPE = torch.bfloat16 if CUDA else torch.float32
COLD_BYTES = 512 << 20  # the pools of one timed call, together: ten times L2


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


def timed(fn, iters: int) -> float:
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


def case(bs: int, context: int, heads: int, bandwidth: float) -> dict:
    width = LATENT + ROPE
    tokens = bs * context
    layer_bytes = tokens * width * DTYPE.itemsize
    layers = max(1, COLD_BYTES // layer_bytes) if CUDA else 1
    pools = [torch.randn(tokens + 1, 1, width, device=DEVICE).to(DTYPE) for _ in range(int(layers))]
    slots = torch.randperm(tokens, device=DEVICE).to(torch.int32) + 1
    req_to_token = slots.view(bs, context)
    rows = torch.arange(bs, device=DEVICE)
    lens = torch.full((bs,), context, device=DEVICE)
    q = torch.randn(bs, heads, width, device=DEVICE).to(DTYPE)
    scale, sms = 192**-0.5, num_sms(torch.device(DEVICE))
    q_latent, q_rope = q[..., :LATENT], q[..., LATENT:]

    def kernel():
        for pool in pools:
            mla_decode_fwd(q_latent, q_rope, pool, req_to_token, rows, lens, scale, sms)

    def native():
        for pool in pools:
            mla_decode_native(q, pool, req_to_token, rows, lens, context, LATENT, scale)

    seconds = timed(kernel, 20) / layers
    native_seconds = timed(native, 3) / layers if CUDA else float("nan")
    read = layer_bytes + q.numel() * q.element_size() + req_to_token.numel() * 4
    result = {
        "bs": bs,
        "context": context,
        "heads": heads,
        "splits": num_splits(bs, heads, sms),
        "layers_per_call": int(layers),
        "us_per_layer": seconds * 1e6,
        "floor_us": read / bandwidth * 1e6,
        "fraction_of_bandwidth": read / seconds / bandwidth,
        "torch_us_per_layer": native_seconds * 1e6,
    }
    print(
        f"=== MLA decode bs {bs} ctx {context} heads {heads}: {result['us_per_layer']:.1f} us "
        f"a layer (floor {result['floor_us']:.1f} us) = "
        f"{100 * result['fraction_of_bandwidth']:.1f}% of the copy bandwidth; torch "
        f"{result['torch_us_per_layer']:.1f} us ({result['splits']} splits)"
    )
    pools.clear()
    if CUDA:
        torch.cuda.empty_cache()
    return result


def main() -> None:
    bandwidth = copy_bandwidth()
    contexts = (4096, 32768) if CUDA else (100,)
    results = [
        case(bs, context, heads, bandwidth)
        for heads in (16, 128)
        for context in contexts
        for bs in ((1, 8) if CUDA else (2,))
    ]
    with open(sys.argv[1], "w") as f:
        json.dump({"copy_bytes_per_s": bandwidth, "cases": results}, f, indent=2)


if __name__ == "__main__":
    main()
