"""ReqToTokenPool rows and their CPU mirror; TokenToKVPool buffers."""

from unittest import mock

import torch

from radixserve.kernels import fused_ops
from radixserve.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixserve.model_executor.forward_inputs import write_req_to_token


def test_req_pool_alloc_and_free_rows() -> None:
    pool = ReqToTokenPool(size=3, max_context_len=4, device="cpu")
    rows = pool.alloc(2)
    assert rows is not None and len(set(rows)) == 2
    assert pool.available_size() == 1
    assert pool.alloc(2) is None
    assert pool.available_size() == 1
    pool.free(rows[0])
    pool.free([rows[1]])
    assert pool.available_size() == 3
    everything = pool.alloc(3)
    assert everything is not None and sorted(everything) == [0, 1, 2]
    pool.clear()
    assert pool.available_size() == 3


def test_req_pool_write_read_round_trip() -> None:
    pool = ReqToTokenPool(size=2, max_context_len=8, device="cpu")
    assert pool.req_to_token.dtype == torch.int32 and pool.req_to_token.shape == (2, 8)
    pool.write(1, 0, torch.tensor([5, 6, 7]))
    pool.write(1, 3, torch.tensor([9]))
    row = pool.read(1, 4)
    assert row.dtype == torch.int64
    assert row.tolist() == [5, 6, 7, 9]
    assert pool.req_to_token[1, :4].tolist() == [5, 6, 7, 9]
    row[0] = 100  # read returns a copy: the pool is unchanged
    assert pool.read(1, 1).tolist() == [5]


def test_write_batch_equals_individual_writes() -> None:
    batched = ReqToTokenPool(size=4, max_context_len=10, device="cpu")
    single = ReqToTokenPool(size=4, max_context_len=10, device="cpu")
    req_indices = [2, 0, 3]
    starts = [0, 4, 7]
    runs = [torch.tensor([1, 2, 3]), torch.tensor([4, 5]), torch.empty(0, dtype=torch.int64)]
    batched.write_batch(req_indices, starts, runs)
    for req_idx, start, run in zip(req_indices, starts, runs, strict=True):
        single.write(req_idx, start, run)
    assert torch.equal(batched.req_to_token, single.req_to_token)
    assert batched.read(2, 3).tolist() == [1, 2, 3]
    assert batched.read(0, 6).tolist()[4:] == [4, 5]
    batched.write_batch([], [], [])
    assert torch.equal(batched.req_to_token, single.req_to_token)


def test_non_cpu_device_keeps_a_separate_cpu_mirror() -> None:
    # The meta device stores no values: reads that return the written slots come from the mirror.
    pool = ReqToTokenPool(size=2, max_context_len=6, device="meta")
    assert pool.req_to_token.device.type == "meta"
    pool.write(0, 0, torch.tensor([3, 4]))
    pool.write_batch([1, 0], [0, 2], [torch.tensor([8]), torch.tensor([5, 6])])
    assert pool.read(0, 4).tolist() == [3, 4, 5, 6]
    assert pool.read(1, 1).tolist() == [8]


def test_kv_pool_shapes_and_slot_zero_is_padding() -> None:
    pool = TokenToKVPool(
        size=5, num_layers=2, num_kv_heads=3, head_dim=4, dtype=torch.float16, device="cpu"
    )
    assert len(pool.k_buffers) == len(pool.v_buffers) == 2
    assert pool.get_key_buffer(1).shape == (6, 3, 4)
    assert pool.get_value_buffer(0).dtype == torch.float16
    k, v = pool.get_kv_buffer(1)
    assert k is pool.k_buffers[1] and v is pool.v_buffers[1]


def test_set_kv_buffer_casts_and_writes_only_the_given_slots() -> None:
    pool = TokenToKVPool(
        size=4, num_layers=2, num_kv_heads=2, head_dim=3, dtype=torch.bfloat16, device="cpu"
    )
    loc = torch.tensor([3, 1])
    cache_k = torch.arange(12, dtype=torch.float32).reshape(2, 2, 3)
    cache_v = -cache_k
    pool.set_kv_buffer(1, loc, cache_k, cache_v)
    k, v = pool.get_kv_buffer(1)
    assert torch.equal(k[3].float(), cache_k[0]) and torch.equal(k[1].float(), cache_k[1])
    assert torch.equal(v[loc].float(), cache_v)
    assert k[0].abs().sum() == 0 and k[2].abs().sum() == 0 and k[4].abs().sum() == 0
    assert pool.get_key_buffer(0).abs().sum() == 0


def test_bytes_per_token() -> None:
    assert TokenToKVPool.bytes_per_token(30, 3, 64, torch.bfloat16) == 2 * 30 * 3 * 64 * 2
    assert TokenToKVPool.bytes_per_token(1, 1, 1, torch.float32) == 8


def test_write_columns_equals_one_slot_writes() -> None:
    batched = ReqToTokenPool(size=4, max_context_len=16, device="cpu")
    single = ReqToTokenPool(size=4, max_context_len=16, device="cpu")
    rows, cols = [3, 0, 2], [5, 0, 15]
    slots = torch.tensor([11, 12, 13])
    batched.write_columns(rows, cols, slots)
    for row, col, slot in zip(rows, cols, slots, strict=True):
        single.write(row, col, slot.reshape(1))
    assert torch.equal(batched.req_to_token, single.req_to_token)
    assert batched.read(2, 16)[15] == 13


def device_like_pool() -> ReqToTokenPool:
    """A CPU pool with a host mirror apart from its table, as on a GPU."""
    return ReqToTokenPool(size=4, max_context_len=16, device="cpu", separate_mirror=True)


def test_writes_reach_the_mirror_at_once_and_the_table_at_the_next_pass() -> None:
    pool = device_like_pool()
    pool.write_batch([2, 0], [0, 3], [torch.tensor([5, 6, 7]), torch.tensor([9])])
    pool.write(2, 1, torch.tensor([8]))  # a later write to the same cell wins
    assert pool.read(2, 3).tolist() == [5, 8, 7] and pool.read(0, 4)[3] == 9
    assert not pool.req_to_token.any()  # the table waits for the model runner
    write_req_to_token(pool)
    assert pool.req_to_token[2, :3].tolist() == [5, 8, 7] and pool.req_to_token[0, 3] == 9
    assert pool.take_device_writes() == []  # applied once


def test_a_decode_pass_stores_its_own_cells() -> None:
    """Cells a decode pass stores from its packed inputs are not queued; the pass's write
    (the store_cells kernel, done by torch here) puts them in the table."""
    pool = device_like_pool()
    pool.write_columns([3, 1], [5, 0], torch.tensor([11, 12]), stored_by_pass=True)
    assert pool.read(3, 6)[5] == 11 and pool.read(1, 1)[0] == 12
    assert pool.take_device_writes() == []

    # the kernel's contract (checked against index_put_ in test_fused_ops*), done by torch here
    def index_put(table, rows, cols, values):
        table.index_put_((rows, cols), values.to(table.dtype))

    with mock.patch.object(fused_ops, "store_cells", side_effect=index_put) as store:
        write_req_to_token(
            pool, (torch.tensor([3, 1]), torch.tensor([5, 0]), torch.tensor([11, 12]))
        )
    store.assert_called_once()
    assert pool.req_to_token[3, 5] == 11 and pool.req_to_token[1, 0] == 12


def test_a_cpu_pool_has_one_table_and_queues_nothing() -> None:
    pool = ReqToTokenPool(size=4, max_context_len=16, device="cpu")
    pool.write_batch([1], [2], [torch.tensor([4, 5])])
    assert pool.req_to_token[1, 2:4].tolist() == [4, 5] and pool.take_device_writes() == []
