"""Timing a kernel as a decode step runs it: with its weights coming from DRAM, not from L2.

A decode step streams gigabytes of weights, so no projection finds its weights in L2 (50 MB
on an H100/H200). A benchmark that replays one projection on one weight tensor does: the 8B
shape's FP8 qkv (25 MB) and o (17 MB) fit in L2 whole, and were timed partly from it. Here
the timed function runs once on each of several copies of the weights, enough of them that
together they are several times L2, and the time is divided by the copies."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from triton.testing import do_bench, do_bench_cudagraph

L2_MULTIPLE = 4  # the copies together are at least this many times the L2 cache


def copies(*tensors: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
    """Enough clones of `tensors` (the first is the original) that each pass over all of them
    reads at least L2_MULTIPLE times the device's L2 cache."""
    l2 = torch.cuda.get_device_properties(tensors[0].device).L2_cache_size
    size = sum(t.numel() * t.element_size() for t in tensors)
    count = max(2, -(-L2_MULTIPLE * l2 // size))
    return [tensors] + [tuple(t.clone() for t in tensors) for _ in range(count - 1)]


def microseconds(run: Callable[..., object], replicas: Sequence[tuple[torch.Tensor, ...]]) -> float:
    """Time of one `run(*replica)`, CUDA graph replays over all replicas in turn."""
    return do_bench_cudagraph(lambda: [run(*r) for r in replicas]) * 1e3 / len(replicas)


def copy_bandwidth() -> float:
    """Bytes per second of a large device-to-device copy (read + write counted): the ceiling a
    stream of weights is measured against, on the machine at hand."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * src.numel() / (ms * 1e-3)
