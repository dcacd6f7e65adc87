"""The prefix cache of `--disable-radix-cache`: nothing is shared between requests.

It implements the same interface as RadixCache so the scheduler keeps one code path; a
request's KV is freed when it finishes, and chunked prefill still works because
cache_unfinished_req records the chunk's slots as the request's prefix.
"""

from __future__ import annotations

import torch

from radixserve.mem_cache.allocator import TokenSlotAllocator
from radixserve.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    CacheableReq,
    MatchResult,
    PrefixNode,
    empty_slots,
)
from radixserve.mem_cache.memory_pool import ReqToTokenPool


class ChunkCache(BasePrefixCache):
    """A prefix cache that caches nothing; see the module docstring."""

    disabled = True

    def __init__(
        self, req_to_token_pool: ReqToTokenPool, token_to_kv_pool_allocator: TokenSlotAllocator
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator

    def match_prefix(self, key: list[int]) -> MatchResult:
        return MatchResult(indices=empty_slots(), last_node=None)

    def insert(self, key: list[int], value: torch.Tensor) -> int:
        """Stores nothing, so nothing was cached before: the caller keeps all of `value`."""
        return 0

    def cache_finished_req(self, req: CacheableReq) -> None:
        kv_indices = self.req_to_token_pool.read(req.req_pool_idx, req.kv_len)
        self.token_to_kv_pool_allocator.free(kv_indices)
        self.req_to_token_pool.free(req.req_pool_idx)

    def cache_unfinished_req(self, req: CacheableReq) -> None:
        req.prefix_indices = self.req_to_token_pool.read(req.req_pool_idx, req.kv_len)

    def release_req(self, req: CacheableReq) -> None:
        """Nothing here is the cache's: a chunked request's `prefix_indices` are its own."""
        self.cache_finished_req(req)

    def inc_lock_ref(self, node: PrefixNode | None) -> None:
        pass

    def dec_lock_ref(self, node: PrefixNode | None) -> None:
        pass

    def evict(self, num_tokens: int) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def total_size(self) -> int:
        return 0

    def reset(self) -> None:
        pass
