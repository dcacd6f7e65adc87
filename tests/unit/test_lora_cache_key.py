"""The prefix cache keys by LoRA adapter (`adapter_key`): whatever the tokens, a prefix cached
under one adapter (or the base model) is matched only under the same one."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.mem_cache.allocator import TokenSlotAllocator
from radixserve.mem_cache.base_prefix_cache import adapter_key
from radixserve.mem_cache.memory_pool import ReqToTokenPool
from radixserve.mem_cache.radix_cache import RadixCache

VOCAB = 1 << 20  # token ids up to a large vocabulary
tokens = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12)
uids = st.integers(0, 1000)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(uids, tokens), min_size=1, max_size=6), uids, tokens)
def test_a_prefix_is_matched_only_under_its_own_adapter(inserted, uid, probe):
    cache = RadixCache(ReqToTokenPool(4, 16, "cpu"), TokenSlotAllocator(256))
    for i, (owner, toks) in enumerate(inserted):
        key = adapter_key(toks, owner)
        cache.insert(key, torch.arange(len(key), dtype=torch.int64) + 16 * i + 1)
    matched = len(cache.match_prefix(adapter_key(probe, uid)).indices)
    # the longest common prefix of the probe with anything inserted under the same adapter
    own = [t for owner, t in inserted if owner == uid]
    best = max(
        (
            next(
                (i for i, (a, b) in enumerate(zip(t, probe, strict=False)) if a != b),
                min(len(t), len(probe)),
            )
            for t in own
        ),
        default=0,
    )
    assert matched == best


def test_the_base_key_is_the_tokens():
    assert adapter_key([1, 2, 3], 0) == [1, 2, 3]
    assert adapter_key([1, 2], 3) == [(3 << 32) + 1, (3 << 32) + 2]
