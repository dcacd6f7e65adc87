"""build_decode_batch: a decode pass's inputs packed into one buffer, padded for a CUDA graph's
captured size (the layout the graph runner's static buffer relies on)."""

from __future__ import annotations

import torch

from radixserve.forward.mode import ForwardMode
from radixserve.forward.worker_batch import ModelWorkerBatch
from radixserve.mem_cache.memory_pool import ReqToTokenPool
from radixserve.model_executor.forward_inputs import DECODE_INPUT_ROWS, build_decode_batch
from radixserve.model_executor.future_tokens import NO_SLOTS, FutureSlots


def decode_batch() -> ModelWorkerBatch:
    return ModelWorkerBatch(
        forward_mode=ForwardMode.DECODE,
        input_ids=torch.tensor([11, -3, 7]),
        req_pool_indices=torch.tensor([4, 0, 9]),
        seq_lens=torch.tensor([5, 17, 2]),
        seq_lens_sum=24,
        out_cache_loc=torch.tensor([40, 41, 42]),
        sampling_info=None,
        has_future_ids=True,
    )


def pool() -> ReqToTokenPool:
    return ReqToTokenPool(size=10, max_context_len=32, device="cpu")


def test_unpadded_decode_inputs():
    fb = build_decode_batch(decode_batch(), pool(), None, None, "cpu", FutureSlots(20, 3))
    assert fb.batch_size == 3 and fb.forward_mode.is_decode()
    assert fb.input_ids.tolist() == [11, -3, 7]
    assert fb.positions.tolist() == [4, 16, 1]  # the new token sits at seq_len - 1
    assert fb.req_pool_indices.tolist() == [4, 0, 9]
    assert fb.seq_lens.tolist() == [5, 17, 2] and fb.seq_lens_cpu.tolist() == [5, 17, 2]
    assert fb.out_cache_loc.tolist() == [40, 41, 42]
    assert fb.future_slots.tolist() == [20, 21, 22]  # where each row's next token goes
    assert fb.seq_lens_sum == 24


def test_padded_into_a_staging_buffer():
    staging = torch.full((DECODE_INPUT_ROWS * 8,), -99, dtype=torch.int64)
    fb = build_decode_batch(
        decode_batch(),
        pool(),
        None,
        None,
        "cpu",
        FutureSlots(5, 3),
        staging=staging,
        padded_size=4,
        seq_len_fill=1,
    )
    assert fb.batch_size == 4
    # rows of the captured size 4 sit back to back at the start of the buffer, as captured
    assert fb.input_ids.data_ptr() == staging.data_ptr()
    assert fb.positions.data_ptr() == staging[4:].data_ptr()
    assert fb.out_cache_loc.data_ptr() == staging[16:].data_ptr()
    # the padded row: request row 0, KV slot 0, the backend's fill length
    assert fb.input_ids.tolist() == [11, -3, 7, 0]
    assert fb.req_pool_indices.tolist() == [4, 0, 9, 0]
    assert fb.seq_lens.tolist() == [5, 17, 2, 1]
    assert fb.out_cache_loc.tolist() == [40, 41, 42, 0]
    assert fb.future_slots.tolist() == [5, 6, 7, 0]  # slot 0: never read
    assert fb.future_slots.data_ptr() == staging[20:].data_ptr()
    assert fb.seq_lens_sum == 25
    assert staging[24:].eq(-99).all()  # nothing beyond this size's rows is touched


def test_capture_layout_is_all_padding():
    """What CudaGraphRunner captures with: no real rows, padded to the captured size."""
    empty = torch.empty(0, dtype=torch.int64)
    nothing = ModelWorkerBatch(ForwardMode.DECODE, empty, empty, empty, 0, empty, None)
    staging = torch.full((DECODE_INPUT_ROWS * 8,), -99, dtype=torch.int64)
    fb = build_decode_batch(
        nothing, pool(), None, None, "cpu", NO_SLOTS, staging=staging, padded_size=2, seq_len_fill=1
    )
    assert fb.batch_size == 2 and fb.seq_lens_sum == 2
    assert staging[:12].view(DECODE_INPUT_ROWS, 2).tolist() == [
        [0, 0],
        [0, 0],
        [0, 0],
        [1, 1],
        [0, 0],
        [0, 0],
    ]
    assert fb.seq_lens_cpu.tolist() == [1, 1]
