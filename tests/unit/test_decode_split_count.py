"""The decode attention's split count (`choose_num_kv_splits`): the rule the H100 sweeps chose
(benchmark-log.md, 2026-12-05 night) at the shapes they measured, and the bounds every shape
keeps: a CUDA graph captured for a batch size replays it with any lengths, so the count is a
function of the batch alone, and the scratch buffer every captured size views must hold it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from radixserve.kernels.decode_attention import (
    MAX_KV_SPLITS,
    choose_num_kv_splits,
    scratch_rows,
)

H100_SMS = 132


def test_the_measured_choices_at_eight_kv_heads() -> None:
    # (batch, splits): one request keeps 4 programs an SM (64 splits, capped); 2-32 requests
    # aim at 2 an SM rounded down (within 3% of the sweep's fastest at 14 of its 15 points);
    # 64 requests, which give more than 2 an SM alone, take two splits (faster than one by
    # 6-7%); 256 take one (no split)
    measured = {1: 64, 2: 16, 4: 8, 8: 4, 16: 2, 32: 1, 64: 2, 256: 1}
    assert {bs: choose_num_kv_splits(bs, 8, H100_SMS) for bs in measured} == measured


@given(
    batch=st.integers(1, 4096),
    kv_heads=st.integers(1, 64),
    sms=st.integers(1, 256),
)
def test_the_count_is_bounded_and_keeps_the_sms_busy(batch: int, kv_heads: int, sms: int) -> None:
    splits = choose_num_kv_splits(batch, kv_heads, sms)
    assert 1 <= splits <= MAX_KV_SPLITS
    if splits > 1:  # a split is added only while the SMs have fewer than 4 programs each
        assert batch * kv_heads * (splits - 1) < 4 * sms
    if splits < MAX_KV_SPLITS:  # and never leaves them below one program each
        assert batch * kv_heads * splits >= min(sms, batch * kv_heads * MAX_KV_SPLITS)


@given(max_bs=st.integers(1, 160), kv_heads=st.sampled_from([1, 2, 4, 8, 16]))
def test_the_scratch_buffer_holds_every_captured_batch(max_bs: int, kv_heads: int) -> None:
    rows = scratch_rows(max_bs, kv_heads, H100_SMS)
    for bs in range(1, max_bs + 1):
        assert bs * choose_num_kv_splits(bs, kv_heads, H100_SMS) <= rows
