"""Time the GPU attention backends on Llama-3-8B-shaped layers and print one table.

Decode is bound by reading K/V: its figure is KV bytes read per call over the median time,
against the device-to-device copy bandwidth measured in the same run. Extend is bound by
matrix work: its figure is causal attention FLOPs over the time, against a measured bf16
matmul rate. Several independent pools are rotated (at least 256 MB of KV in all) so
repeated calls do not hit in L2, and the calls are captured in a CUDA graph and timed by
replay, so the figure is GPU time without Python launch overhead (as the server's decode runs).
The Triton extend kernel's tile configurations are swept on the same shapes.

`--splits 1,2,4`: instead, the Triton decode kernel at batch 16, 64 and 256 (`--split-batches`)
and 512 and 1,024 tokens (`--split-contexts`) with each split count forced, beside the count it
chooses (`choose_num_kv_splits`: 2 or 4 programs an SM, by batch):
whether a large batch, which fills the GPU without splitting, pays for splits and their merge
(at batch 64 the merge's launch was 3-7 us a layer of a step, 2026-12-05).

Usage (on the GPU machine, repo root): PYTHONPATH=worker:tests/gpu python scripts/gpu/bench_attention.py
  [--splits 1,2,4 [--split-batches 2,4,8,16,32] [--split-contexts 512,4096]] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
from importlib.util import find_spec

import torch
import triton.testing
from attention_cases import make_case, run_backend
from l2_cold import copy_bandwidth

from radixserve.forward.mode import ForwardMode
from radixserve.kernels.extend_attention import extend_attention_fwd
from radixserve.layers.attention import triton_backend
from radixserve.layers.attention.triton_backend import TritonAttnBackend

HEADS, KV_HEADS, HEAD_DIM, DTYPE = 32, 8, 128, torch.bfloat16
KV_TOKEN_BYTES = 2 * KV_HEADS * HEAD_DIM * DTYPE.itemsize
ROTATE_BYTES = 256 << 20  # KV bytes spread over the rotated pools of one setting
EXTEND_TILES = [(128, 64, 8, 1), (128, 64, 8, 2), (128, 128, 8, 2), (64, 64, 4, 2), (64, 128, 4, 2)]


def matmul_rate() -> float:
    """bf16 FLOP/s of an 8192^3 matmul on random data."""
    a = torch.randn(8192, 8192, dtype=DTYPE, device="cuda")
    b = torch.randn(8192, 8192, dtype=DTYPE, device="cuda")
    ms = triton.testing.do_bench(lambda: a @ b, return_mode="median")
    return 2 * 8192**3 / (ms * 1e-3)


def backends() -> dict[str, type]:
    found: dict[str, type] = {"triton": TritonAttnBackend}
    if find_spec("flashinfer") is not None:
        from radixserve.layers.attention.flashinfer_backend import FlashInferAttnBackend

        found["flashinfer"] = FlashInferAttnBackend
    return found


def graph_ms(calls: list) -> float:
    """Median milliseconds per call, from replays of one graph that makes every call once."""
    for call in calls:  # compile / plan outside the capture
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    ms = triton.testing.do_bench(graph.replay, warmup=20, rep=200, return_mode="median")
    return ms / len(calls)


def make_runs(backend_cls: type | None, mode: ForwardMode, prefix: list[int], extend: list[int]):
    kv_bytes = sum(p + e for p, e in zip(prefix, extend, strict=True)) * KV_TOKEN_BYTES
    gen = torch.Generator().manual_seed(0)
    runs = []
    for _ in range(max(2, min(32, -(-ROTATE_BYTES // kv_bytes)))):
        case = make_case(mode, prefix, extend, HEADS, KV_HEADS, HEAD_DIM, DTYPE, "cuda", gen)
        case.dense_k.clear()  # the reference's copies are not needed here
        case.dense_v.clear()
        backend = backend_cls(case.context) if backend_cls else None
        if backend:
            run_backend(backend, case)  # metadata planned once, as per forward pass
        runs.append((backend, case))
    return runs


def time_backend(backend_cls: type, mode: ForwardMode, prefix: list[int], extend: list[int]):
    """Graph-replay time per call; eager time (launch overhead included) if capture fails."""
    runs = make_runs(backend_cls, mode, prefix, extend)
    calls = [lambda b=b, c=c: b.forward(c.q, c.k, c.v, c.layer, c.forward_batch) for b, c in runs]
    try:
        return graph_ms(calls)
    except RuntimeError as exc:
        print(f"  capture failed ({str(exc)[:80]}); eager timing")
        torch.cuda.synchronize()
        return triton.testing.do_bench(calls[0], return_mode="median")


def time_extend_tile(tile, prefix: list[int], extend: list[int]) -> float:
    """The Triton extend kernel alone (no KV store) with one tile configuration."""
    runs = make_runs(None, ForwardMode.EXTEND, prefix, extend)

    def call(case) -> None:
        fb, k_buf, v_buf = case.forward_batch, *case.forward_batch.token_to_kv_pool.get_kv_buffer(0)
        q = case.q.view(-1, HEADS, HEAD_DIM)
        extend_attention_fwd(
            q, case.k.view(-1, KV_HEADS, HEAD_DIM), case.v.view(-1, KV_HEADS, HEAD_DIM),
            torch.empty_like(q), k_buf, v_buf, fb.req_to_token_pool.req_to_token,
            fb.req_pool_indices, fb.extend_prefix_lens, fb.extend_seq_lens, fb.extend_start_loc,
            max(extend), HEAD_DIM**-0.5, tile=tile,
        )  # fmt: skip

    return graph_ms([lambda c=c: call(c) for _, c in runs])


@contextlib.contextmanager
def forced_splits(splits: int):
    """The Triton backend's decode metadata (built per pass outside a graph) with `splits`."""
    chosen = triton_backend.choose_num_kv_splits
    triton_backend.choose_num_kv_splits = lambda bs, kv_heads, sms: splits
    try:
        yield
    finally:
        triton_backend.choose_num_kv_splits = chosen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", help="write all rows here too")
    parser.add_argument("--splits", help="comma-separated split counts: only the split sweep")
    parser.add_argument("--split-batches", default="16,64,256", help="the split sweep's batches")
    parser.add_argument("--split-contexts", default="512,1024", help="its context lengths")
    args = parser.parse_args()
    bandwidth, flops = copy_bandwidth(), matmul_rate()
    print(f"ceilings: copy {bandwidth / 1e12:.2f} TB/s, bf16 matmul {flops / 1e12:.0f} TFLOP/s")
    rows = []
    print(f"{'pass':7}{'backend':16}{'shape':28}{'ms':>9}  of limit")

    def add(kind: str, name: str, shape: str, ms: float, frac: float) -> None:
        rows.append((kind, name, shape, ms, frac))
        print(f"{kind:7}{name:16}{shape:28}{ms:9.4f}  {frac:6.1%}", flush=True)

    if args.splits:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        batches, contexts = (
            list(map(int, a.split(","))) for a in (args.split_batches, args.split_contexts)
        )
        for bs, ctx in itertools.product(batches, contexts):
            own = triton_backend.choose_num_kv_splits(bs, KV_HEADS, sms)
            for splits in sorted({own, *map(int, args.splits.split(","))}):
                with forced_splits(splits):
                    ms = time_backend(
                        TritonAttnBackend, ForwardMode.DECODE, [ctx - 1] * bs, [1] * bs
                    )
                rate = bs * ctx * KV_TOKEN_BYTES / (ms * 1e-3)
                label = f"splits={splits}" + (" (own)" if splits == own else "")
                add("decode", label, f"bs={bs} ctx={ctx}", ms, rate / bandwidth)
    for bs, ctx in itertools.product([] if args.splits else [1, 16, 64, 256], [1024, 4096]):
        for name, cls in backends().items():
            ms = time_backend(cls, ForwardMode.DECODE, [ctx - 1] * bs, [1] * bs)
            rate = bs * ctx * KV_TOKEN_BYTES / (ms * 1e-3)
            add("decode", name, f"bs={bs} ctx={ctx}", ms, rate / bandwidth)
    for bs, prefix, new in [] if args.splits else [(1, 0, 4096), (8, 0, 1024), (8, 1024, 512)]:
        # QK^T and PV: 2 matmuls of 2*d flops per visible (query, key) pair and head
        pairs = bs * (new * prefix + new * (new + 1) / 2)
        work = 4 * HEAD_DIM * HEADS * pairs
        shape = f"bs={bs} prefix={prefix} new={new}"
        for name, cls in backends().items():
            ms = time_backend(cls, ForwardMode.EXTEND, [prefix] * bs, [new] * bs)
            add("extend", name, shape, ms, work / (ms * 1e-3) / flops)
        for tile in EXTEND_TILES:
            ms = time_extend_tile(tile, [prefix] * bs, [new] * bs)
            label = "tile" + "/".join(map(str, tile))
            add("extend", label, shape, ms, work / (ms * 1e-3) / flops)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_Bps": bandwidth, "bf16_flops": flops, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
