"""The ring of future token ids (overlap scheduling): a launched batch's samples are stored
on the device under slots that later batches name as negative input ids before the host has
the tokens."""

from __future__ import annotations

import torch

from radixserve.model_executor.model_runner import ModelRunner
from radixserve.model_loader.loader import load_model_source
from radixserve.server_args import ServerArgs


def make_runner() -> ModelRunner:
    args = ServerArgs(
        model="random:tiny-llama", device="cpu", max_total_tokens=1024, max_running_requests=4
    )
    return ModelRunner(args, load_model_source(args.model, dtype="float32", device="cpu"))


def test_stored_ids_resolve_and_real_ids_pass_through():
    runner = make_runner()
    start = runner.reserve_future_slots(3)
    runner.store_future_ids(torch.tensor([11, 12, 13]), start)
    named = torch.tensor([-(start + 2), 7, -start, -(start + 1)])
    assert runner.resolve_future_ids(named).tolist() == [13, 7, 11, 12]


def test_ring_wraps_without_slot_0_or_overrunning():
    runner = make_runner()
    capacity = runner.future_token_ids.numel()  # slot 0 included, never handed out
    starts = []
    for step in range(capacity):
        start = runner.reserve_future_slots(3)
        runner.store_future_ids(torch.full((3,), step), start)
        assert start >= 1 and start + 3 <= capacity
        starts.append(start)
        assert runner.resolve_future_ids(-torch.arange(start, start + 3)).tolist() == [step] * 3
    assert starts.count(1) >= 2  # it wrapped
    # the previous batch's slots are still intact after the next batch is stored
    prev = runner.reserve_future_slots(3)
    runner.store_future_ids(torch.tensor([1, 2, 3]), prev)
    runner.store_future_ids(torch.tensor([4, 5, 6]), runner.reserve_future_slots(3))
    assert runner.resolve_future_ids(-torch.arange(prev, prev + 3)).tolist() == [1, 2, 3]
