"""ScheduleBatch.prepare_for_decode's req_to_token writes on a device pool: the decode pass
stores the new slots itself, so the step writes the host mirror only and queues nothing, unless
the step rides in an extend-shaped (mixed) pass, which applies the queued writes instead.

A CPU pool with a separate mirror stands in for a device pool here."""

from __future__ import annotations

import torch

from radixserve.mem_cache.allocator import TokenSlotAllocator
from radixserve.mem_cache.chunk_cache import ChunkCache
from radixserve.mem_cache.memory_pool import ReqToTokenPool
from radixserve.model_executor.forward_inputs import write_req_to_token
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.scheduler.schedule_batch import Req, ScheduleBatch


def prefilled_batch() -> tuple[ScheduleBatch, ReqToTokenPool]:
    pool = ReqToTokenPool(size=4, max_context_len=32, device="cpu", separate_mirror=True)
    allocator = TokenSlotAllocator(256)
    cache = ChunkCache(pool, allocator)
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    reqs = [Req(f"r{i}", list(range(10, 15 + 3 * i)), params) for i in range(3)]
    for req in reqs:
        req.init_next_round_input(cache)
    batch = ScheduleBatch(reqs, pool, allocator, cache, 100, "cpu", set())
    batch.prepare_for_extend()
    for req in reqs:
        req.output_ids.append(7)
    return batch, pool


def new_cells(batch: ScheduleBatch, table: torch.Tensor) -> list[int]:
    return [int(table[r.req_pool_idx, r.kv_len - 1]) for r in batch.reqs]


def test_a_decode_step_writes_the_mirror_and_leaves_the_device_to_the_pass() -> None:
    batch, pool = prefilled_batch()
    write_req_to_token(pool)  # the prefill pass
    before = pool.req_to_token.clone()
    batch.prepare_for_decode()
    assert new_cells(batch, pool._cpu_mirror) == batch.out_cache_loc.tolist()
    assert pool.take_device_writes() == []  # stored by the decode pass itself
    assert torch.equal(pool.req_to_token, before)


def test_a_step_for_a_mixed_pass_is_queued_for_the_device() -> None:
    batch, pool = prefilled_batch()
    batch.prepare_for_decode(in_extend_pass=True)
    assert new_cells(batch, pool._cpu_mirror) == batch.out_cache_loc.tolist()
    write_req_to_token(pool)  # the mixed (extend-shaped) pass
    assert new_cells(batch, pool.req_to_token) == batch.out_cache_loc.tolist()
    assert torch.equal(pool.req_to_token, pool._cpu_mirror)
