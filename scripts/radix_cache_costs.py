"""The radix caches' host costs at the tree sizes a long-running server reaches: a prompt's
insert and match, and an eviction of 64 tokens, the scheduler loop's own time (CPU only).

Each size: N prompts (one of 20 shared 32-token system prompts, then 32 tokens of their own)
are inserted, each is matched once, then 50 evictions of 64 tokens run; the median of 3 runs
per figure, each phase after a full collection (the runs before leave their trees to the
collector). With the host tier (`TieredRadixCache`, write-back; the second table): half the
prompts' own tokens are evicted to the host first, which that fills, so each timed eviction
backs prompts up and drops others from the host. The numbers recorded in
docs/benchmark-log.md (2026-12-05) came from this script.

Usage: python3 scripts/radix_cache_costs.py [N ...]   (default: 1000 10000 50000)
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import time

import torch

from radixserve.mem_cache.allocator import TokenSlotAllocator
from radixserve.mem_cache.host_pool import HostKVPool
from radixserve.mem_cache.memory_pool import TokenToKVPool
from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.mem_cache.tiered_cache import TieredRadixCache


def one_run(n: int, seed: int, tiered: bool) -> tuple[float, float, float]:
    """(seconds an insert, a match, an eviction) over n cached prompts."""
    slots = n * 64 + 1000
    allocator = TokenSlotAllocator(slots)
    if tiered:
        kv = TokenToKVPool(slots, 1, 1, 1, torch.float16, "cpu")
        cache = TieredRadixCache(None, allocator, HostKVPool(kv, n * 16))  # type: ignore[arg-type]
    else:
        cache = RadixCache(None, allocator)  # type: ignore[arg-type]  # no request rows needed
    rng = random.Random(seed)
    systems = [[rng.randrange(50000) for _ in range(32)] for _ in range(20)]
    keys = [systems[i % 20] + [rng.randrange(50000) for _ in range(32)] for i in range(n)]
    gc.collect()  # not timed: what the runs before left
    start = time.perf_counter()
    for key in keys:
        cache.insert(key, allocator.alloc(len(key)))
    insert = (time.perf_counter() - start) / n
    start = time.perf_counter()
    for key in keys:
        cache.match_prefix(key)
    match = (time.perf_counter() - start) / n
    if tiered:
        cache.evict(n * 16)  # half the prompts (their own 32 tokens) to the host: full
    evictions = 50
    start = time.perf_counter()
    for _ in range(evictions):
        cache.evict(64)
    return insert, match, (time.perf_counter() - start) / evictions


for tiered in (False, True):
    print("with the host tier (write-back, full)" if tiered else "device only")
    for n in [int(a) for a in sys.argv[1:]] or [1000, 10000, 50000]:
        runs = [one_run(n, seed, tiered) for seed in range(3)]
        insert, match, evict = (statistics.median(r[i] for r in runs) for i in range(3))
        print(
            f"{n:6d} cached prompts: insert {insert * 1e6:.1f} us, match {match * 1e6:.1f} us, "
            f"evict(64) {evict * 1e3:.3f} ms (median of 3)"
        )
