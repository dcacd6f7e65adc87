"""FutureTokens (overlap scheduling): a launched batch's samples are stored on the device
under reserved slots that later batches name by placeholder input ids before the host has
the tokens."""

from __future__ import annotations

import torch

from radixserve.model_executor.future_tokens import FutureTokens


def test_stored_ids_resolve_and_real_ids_pass_through():
    future = FutureTokens(max_batch_size=4, device=torch.device("cpu"))
    slots = future.reserve(3)
    future.store(slots, torch.tensor([11, 12, 13]))
    named = torch.tensor([slots.placeholder(2), 7, slots.placeholder(0), slots.placeholder(1)])
    assert future.resolve(named).tolist() == [13, 7, 11, 12]


def test_placeholders_never_collide_with_real_ids():
    future = FutureTokens(max_batch_size=4, device=torch.device("cpu"))
    for _ in range(10):
        slots = future.reserve(4)
        assert all(slots.placeholder(i) < 0 for i in range(4))


def test_greedy_choice_is_stored_in_the_rows_slots():
    future = FutureTokens(max_batch_size=4, device=torch.device("cpu"))
    slots = future.reserve(2)
    index = torch.empty(2, dtype=torch.int64)
    slots.write_slots(index)
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 1.0]])
    assert future.store_greedy(logits, index).tolist() == [1, 0]
    assert future.resolve(torch.tensor([slots.placeholder(0), slots.placeholder(1)])).tolist() == [
        1,
        0,
    ]


def test_ring_wraps_without_slot_0_or_overrunning():
    future = FutureTokens(max_batch_size=3, device=torch.device("cpu"))
    capacity = future.ids.numel()  # slot 0 included, never handed out
    starts = []
    for step in range(capacity):
        slots = future.reserve(3)
        future.store(slots, torch.full((3,), step))
        assert slots.start >= 1 and slots.start + 3 <= capacity
        starts.append(slots.start)
        names = torch.tensor([slots.placeholder(i) for i in range(3)])
        assert future.resolve(names).tolist() == [step] * 3
    assert starts.count(1) >= 2  # it wrapped
    # the previous batch's slots are still intact after the next batch is stored
    prev = future.reserve(3)
    future.store(prev, torch.tensor([1, 2, 3]))
    future.store(future.reserve(3), torch.tensor([4, 5, 6]))
    names = torch.tensor([prev.placeholder(i) for i in range(3)])
    assert future.resolve(names).tolist() == [1, 2, 3]
