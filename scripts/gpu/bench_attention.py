"""Time the GPU attention backends on Llama-3-8B-shaped layers and print one table.

Decode is bound by reading K/V: its figure is KV bytes read per call over the median time,
against the device-to-device copy bandwidth measured in the same run. Extend is bound by
matrix work: its figure is causal attention FLOPs over the time, against a measured bf16
matmul rate. Several independent pools are rotated so repeated calls do not hit in L2.

Usage (on the GPU machine, repo root): PYTHONPATH=worker:tests/gpu python scripts/gpu/bench_attention.py
"""

from __future__ import annotations

import argparse
import itertools
import json
from importlib.util import find_spec

import torch
import triton.testing
from attention_cases import make_case, run_backend
from radixserve.layers.attention.triton_backend import TritonAttnBackend
from radixserve.model_executor.forward_batch_info import ForwardMode

HEADS, KV_HEADS, HEAD_DIM, DTYPE = 32, 8, 128, torch.bfloat16
ROTATE = 3  # independent pools per setting, cycled per call


def copy_bandwidth() -> float:
    """Bytes per second of a large device-to-device copy (read + write counted)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * src.numel() / (ms * 1e-3)


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


def time_backend(backend_cls: type, mode: ForwardMode, prefix: list[int], extend: list[int]):
    gen = torch.Generator().manual_seed(0)
    runs = []
    for _ in range(ROTATE):
        case = make_case(mode, prefix, extend, HEADS, KV_HEADS, HEAD_DIM, DTYPE, "cuda", gen)
        backend = backend_cls(case.model_runner)
        run_backend(backend, case)  # metadata planned once, as per forward pass
        runs.append((backend, case))
    calls = itertools.cycle(runs)

    def one_call() -> None:
        backend, case = next(calls)
        backend.forward(case.q, case.k, case.v, case.layer, case.forward_batch)

    ms = triton.testing.do_bench(one_call, warmup=50, rep=300, return_mode="median")
    del runs
    torch.cuda.empty_cache()
    return ms


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", help="write all rows here too")
    args = parser.parse_args()
    bandwidth, flops = copy_bandwidth(), matmul_rate()
    print(f"ceilings: copy {bandwidth / 1e12:.2f} TB/s, bf16 matmul {flops / 1e12:.0f} TFLOP/s")
    rows = []
    kv_token_bytes = 2 * KV_HEADS * HEAD_DIM * DTYPE.itemsize
    for bs, ctx in itertools.product([1, 16, 64, 256], [1024, 4096]):
        for name, cls in backends().items():
            ms = time_backend(cls, ForwardMode.DECODE, [ctx - 1] * bs, [1] * bs)
            rate = bs * ctx * kv_token_bytes / (ms * 1e-3)
            rows.append(("decode", name, f"bs={bs} ctx={ctx}", ms, rate / bandwidth))
    for bs, prefix, new in [(1, 0, 4096), (8, 0, 1024), (8, 1024, 512)]:
        for name, cls in backends().items():
            ms = time_backend(cls, ForwardMode.EXTEND, [prefix] * bs, [new] * bs)
            # QK^T and PV: 2 matmuls of 2*d flops per visible (query, key) pair and head
            pairs = bs * (new * prefix + new * (new + 1) / 2)
            rate = 4 * HEAD_DIM * HEADS * pairs / (ms * 1e-3)
            rows.append(("extend", name, f"bs={bs} prefix={prefix} new={new}", ms, rate / flops))
    print(f"{'pass':7}{'backend':12}{'shape':30}{'ms':>9}  of limit")
    for kind, name, shape, ms, frac in rows:
        print(f"{kind:7}{name:12}{shape:30}{ms:9.4f}  {frac:6.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_Bps": bandwidth, "bf16_flops": flops, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
