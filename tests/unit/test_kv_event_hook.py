"""The radix cache's event hook: which token ranges it reports stored, removed and cleared on
the GPU (the contract the host and disk tiers report through too)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixserve.mem_cache.allocator import TokenSlotAllocator
from radixserve.mem_cache.kv_event_sink import Medium
from radixserve.mem_cache.memory_pool import ReqToTokenPool
from radixserve.mem_cache.radix_cache import RadixCache


class RecordingSink:
    """Every call, as (kind, token path, start, medium)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int], int, str]] = []

    def stored(self, token_ids: Sequence[int], start: int, medium: Medium) -> None:
        self.calls.append(("stored", list(token_ids), start, medium))

    def removed(self, token_ids: Sequence[int], start: int, medium: Medium) -> None:
        self.calls.append(("removed", list(token_ids), start, medium))

    def cleared(self) -> None:
        self.calls.append(("cleared", [], 0, ""))


def make_cache(sink: RecordingSink | None) -> RadixCache:
    pool = ReqToTokenPool(size=4, max_context_len=16, device="cpu")
    return RadixCache(pool, TokenSlotAllocator(64), event_sink=sink)


def insert(cache: RadixCache, key: list[int]) -> None:
    value = cache.token_to_kv_pool_allocator.alloc(len(key))
    assert value is not None
    num_cached = cache.insert(key, value)
    cache.token_to_kv_pool_allocator.free(value[:num_cached])


def test_new_nodes_are_reported_with_their_whole_path_and_start() -> None:
    sink = RecordingSink()
    cache = make_cache(sink)
    assert sink.calls == []  # a new cache clears nothing
    insert(cache, [1, 2, 3])
    insert(cache, [1, 2, 3])  # nothing new
    insert(cache, [1, 2, 9, 9])  # splits [1, 2, 3]: only the new branch is news
    assert sink.calls == [
        ("stored", [1, 2, 3], 0, "GPU"),
        ("stored", [1, 2, 9, 9], 2, "GPU"),
    ]


def test_eviction_reports_each_leaf_and_a_parent_left_childless() -> None:
    sink = RecordingSink()
    cache = make_cache(sink)
    insert(cache, [1, 2, 3])
    insert(cache, [1, 2, 9, 9])
    sink.calls.clear()
    assert cache.evict(100) == 5
    assert sorted(sink.calls) == [
        ("removed", [1, 2], 0, "GPU"),
        ("removed", [1, 2, 3], 2, "GPU"),
        ("removed", [1, 2, 9, 9], 2, "GPU"),
    ]
    # the parent goes last: its children's paths were reported while it still existed
    assert sink.calls[-1] == ("removed", [1, 2], 0, "GPU")


def test_flush_reports_cleared() -> None:
    sink = RecordingSink()
    cache = make_cache(sink)
    insert(cache, [5, 6])
    cache.reset()
    assert sink.calls[-1][0] == "cleared"


def test_without_a_sink_the_cache_works_unchanged() -> None:
    cache = make_cache(None)
    insert(cache, [1, 2, 3])
    assert cache.match_prefix([1, 2, 3]).indices.numel() == 3
    assert cache.evict(3) == 3
    cache.reset()
    assert cache.all_values().numel() == 0
    assert torch.equal(cache.match_prefix([1]).indices, torch.empty(0, dtype=torch.int64))
