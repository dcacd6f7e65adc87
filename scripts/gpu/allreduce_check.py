"""How fast the GPUs of this machine all-reduce: what tensor parallelism pays per collective.

Usage (two GPUs): python3 scripts/gpu/allreduce_check.py [--json PATH]
Prints peer access, then for each size (a batch-1 decode step's 8 KB activation up to a
16k-token prefill's 128 MiB) the time of one NCCL all-reduce replayed in a CUDA graph, as the
decode step runs it, and eagerly; with NCCL_DEBUG=INFO in the environment NCCL says which
transport it chose (P2P over NVLink, or SHM through host memory).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [8 << 10, 64 << 10, 1 << 20, 16 << 20, 128 << 20]


def _time(fn, iters: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()  # also lines the ranks up: an all-reduce returns when both have joined
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3  # us


def _worker(rank: int, world: int, port: int, results: dict) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        device_id=torch.device("cuda", rank),
    )
    rows = []
    for size in SIZES:
        x = torch.zeros(size // 2, dtype=torch.bfloat16, device="cuda")
        dist.all_reduce(x)  # communicator set up outside capture
        iters = 50 if size <= 1 << 20 else 10
        eager = _time(lambda x=x: dist.all_reduce(x), iters)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(iters):
                dist.all_reduce(x)
        replay = _time(graph.replay, 1) / iters
        bus_gbs = 2 * (world - 1) / world * size / (replay * 1e-6) / 1e9
        rows.append({"bytes": size, "eager_us": eager, "graph_us": replay, "bus_GBs": bus_gbs})
    if rank == 0:
        results["rows"] = rows
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # forbidden on the lent machines
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    world = torch.cuda.device_count()
    peer = [
        [torch.cuda.can_device_access_peer(a, b) if a != b else True for b in range(world)]
        for a in range(world)
    ]
    print(f"{world} GPUs, peer access {peer}, NCCL {torch.cuda.nccl.version()}")
    with mp.Manager() as manager:
        results = manager.dict()
        port = 29500 + os.getpid() % 1000
        mp.spawn(_worker, args=(world, port, results), nprocs=world)
        rows = results["rows"]
    print(f"{'bytes':>12}{'eager us':>10}{'graph us':>10}{'bus GB/s':>10}")
    for r in rows:
        print(f"{r['bytes']:>12}{r['eager_us']:>10.1f}{r['graph_us']:>10.1f}{r['bus_GBs']:>10.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peer_access": peer, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
