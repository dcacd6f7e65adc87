"""ChunkCache (--disable-radix-cache): the prefix-cache interface with no sharing at all."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixserve.mem_cache.allocator import TokenSlotAllocator
from radixserve.mem_cache.chunk_cache import ChunkCache
from radixserve.mem_cache.memory_pool import ReqToTokenPool


@dataclass
class FakeReq:
    """The fields of the scheduler's Req that the cache reads and writes."""

    req_pool_idx: int
    origin_input_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    kv_len: int = 0
    prefix_indices: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    last_node: None = None


NUM_SLOTS = 10


def make_cache() -> ChunkCache:
    pool = ReqToTokenPool(size=2, max_context_len=8, device="cpu")
    return ChunkCache(pool, TokenSlotAllocator(NUM_SLOTS))


def start_request(cache: ChunkCache, tokens: list[int], kv_len: int) -> FakeReq:
    rows = cache.req_to_token_pool.alloc(1)
    new_slots = cache.token_to_kv_pool_allocator.alloc(kv_len)
    assert rows is not None and new_slots is not None
    cache.req_to_token_pool.write(rows[0], 0, new_slots)
    return FakeReq(rows[0], tokens, kv_len=kv_len)


def test_nothing_is_ever_matched_or_cached() -> None:
    cache = make_cache()
    assert cache.disabled
    assert cache.insert([1, 2], torch.tensor([1, 2])) == 0
    match = cache.match_prefix([1, 2])
    assert match.indices.numel() == 0 and match.indices.dtype == torch.int64
    assert match.last_node is None
    cache.inc_lock_ref(match.last_node)
    cache.dec_lock_ref(match.last_node)
    assert cache.evict(5) == 0
    assert cache.total_size() == cache.evictable_size() == cache.protected_size() == 0
    cache.reset()
    assert cache.total_size() == 0


def test_finished_request_frees_all_its_slots_and_its_row() -> None:
    cache = make_cache()
    req = start_request(cache, [1, 2, 3], kv_len=3)
    other = start_request(cache, [1, 2, 3], kv_len=3)
    assert cache.token_to_kv_pool_allocator.available_size() == NUM_SLOTS - 6
    cache.cache_finished_req(req)
    assert cache.token_to_kv_pool_allocator.available_size() == NUM_SLOTS - 3
    assert cache.req_to_token_pool.available_size() == 1
    cache.cache_finished_req(other)
    assert cache.token_to_kv_pool_allocator.available_size() == NUM_SLOTS
    cache.token_to_kv_pool_allocator.check_no_duplicates()
    assert cache.match_prefix([1, 2, 3]).indices.numel() == 0


def test_chunked_prefill_keeps_the_row_and_records_the_chunk_as_prefix() -> None:
    cache = make_cache()
    allocator = cache.token_to_kv_pool_allocator
    req = start_request(cache, [5, 6, 7, 8, 9], kv_len=2)
    first_chunk = cache.req_to_token_pool.read(req.req_pool_idx, 2)
    cache.cache_unfinished_req(req)
    assert req.prefix_indices.tolist() == first_chunk.tolist()
    assert cache.req_to_token_pool.available_size() == 1
    assert allocator.available_size() == NUM_SLOTS - 2
    second_chunk = allocator.alloc(3)
    assert second_chunk is not None
    cache.req_to_token_pool.write(req.req_pool_idx, 2, second_chunk)
    req.kv_len = 5
    cache.cache_unfinished_req(req)
    assert req.prefix_indices.tolist() == first_chunk.tolist() + second_chunk.tolist()
    cache.cache_finished_req(req)
    assert allocator.available_size() == NUM_SLOTS
    assert cache.req_to_token_pool.available_size() == 2
    allocator.check_no_duplicates()
