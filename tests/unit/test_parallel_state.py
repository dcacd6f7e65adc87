"""How attention heads and rows split over tensor-parallel ranks."""

from __future__ import annotations

import pytest

from radixserve.distributed.parallel_state import HeadShard, even_shard, head_shard


def test_smollm2_heads_split_unevenly_by_kv_group():
    # 9 query heads in 3 KV groups over 2 ranks: 2 groups + 1 group
    assert head_shard(9, 3, 0, 2) == HeadShard(0, 6, 0, 2)
    assert head_shard(9, 3, 1, 2) == HeadShard(6, 3, 2, 1)


@pytest.mark.parametrize(
    "heads,kv,size", [(32, 8, 1), (32, 8, 2), (32, 8, 4), (32, 8, 8), (16, 16, 4)]
)
def test_shards_cover_every_head_once(heads, kv, size):
    shards = [head_shard(heads, kv, r, size) for r in range(size)]
    assert sum(s.q_count for s in shards) == heads
    assert sum(s.kv_count for s in shards) == kv
    group = heads // kv
    for s in shards:  # each rank's queries use only its own KV heads
        assert s.q_start // group == s.kv_start
        assert (s.q_start + s.q_count - 1) // group == s.kv_start + s.kv_count - 1


def test_fewer_kv_heads_than_ranks_replicates_the_kv_head_queries_need():
    shards = [head_shard(8, 2, r, 4) for r in range(4)]
    assert [s.q_start for s in shards] == [0, 2, 4, 6]
    assert [s.kv_start for s in shards] == [0, 0, 1, 1]
    assert all(s.kv_count == 1 and s.q_count == 2 for s in shards)
    with pytest.raises(ValueError, match="do not split"):
        head_shard(6, 1, 0, 4)


def test_even_shard_pads_the_last_rank():
    assert [even_shard(10, r, 4) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert even_shard(49152, 1, 2) == (24576, 49152)
