"""The radix cache's host costs at the tree sizes a long-running server reaches: a prompt's
insert and match, and an eviction of 64 tokens, the scheduler loop's own time (CPU only).

Each size: N prompts of 64 tokens over 20 shared 32-token system prompts are inserted, each is
matched once, then 50 evictions of 64 tokens run; the median of 3 runs per figure. The numbers
recorded in docs/benchmark-log.md (2026-12-05) came from this script.

Usage: python3 scripts/radix_cache_costs.py [N ...]   (default: 1000 10000 50000)
"""

from __future__ import annotations

import random
import statistics
import sys
import time

from radixserve.mem_cache.allocator import TokenSlotAllocator
from radixserve.mem_cache.radix_cache import RadixCache


def one_run(n: int, seed: int) -> tuple[float, float, float]:
    """(seconds an insert, a match, an eviction) over n cached prompts."""
    allocator = TokenSlotAllocator(n * 64 + 1000)
    cache = RadixCache(None, allocator)  # type: ignore[arg-type]  # no request rows needed
    rng = random.Random(seed)
    systems = [[rng.randrange(50000) for _ in range(32)] for _ in range(20)]
    keys = [systems[i % 20] + [rng.randrange(50000) for _ in range(32)] for i in range(n)]
    start = time.perf_counter()
    for key in keys:
        cache.insert(key, allocator.alloc(len(key)))
    insert = (time.perf_counter() - start) / n
    start = time.perf_counter()
    for key in keys:
        cache.match_prefix(key)
    match = (time.perf_counter() - start) / n
    evictions = 50
    start = time.perf_counter()
    for _ in range(evictions):
        cache.evict(64)
    return insert, match, (time.perf_counter() - start) / evictions


for n in [int(a) for a in sys.argv[1:]] or [1000, 10000, 50000]:
    runs = [one_run(n, seed) for seed in range(3)]
    insert, match, evict = (statistics.median(r[i] for r in runs) for i in range(3))
    print(
        f"{n:6d} cached prompts: insert {insert * 1e6:.1f} us, match {match * 1e6:.1f} us, "
        f"evict(64) {evict * 1e3:.3f} ms (median of 3)"
    )
