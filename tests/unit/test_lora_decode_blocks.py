"""`kernels/lora.decode_blocks`: a decode pass's rows grouped by adapter slot into blocks of one
slot, the table the grouped kernels read (their values: test_lora_interpret.py)."""

from __future__ import annotations

import random

import pytest

from radixserve.kernels.lora import DECODE_BLOCK_M, decode_blocks, max_decode_blocks

WIDTH = 1 + DECODE_BLOCK_M


def blocks_of(row_slots: list[int], slots: int) -> list[tuple[int, list[int]]]:
    table = decode_blocks(row_slots, slots)
    assert len(table) == max_decode_blocks(len(row_slots), slots) * WIDTH
    return [
        (table[i], [r for r in table[i + 1 : i + WIDTH] if r >= 0])
        for i in range(0, len(table), WIDTH)
    ]


def patterns():
    rng = random.Random(0)
    yield [-1] * 64, 8  # base rows only: every block empty
    yield [3] * 64, 8  # one adapter: four full blocks
    yield list(range(8)) * 8, 8  # 8 adapters over 64 rows, interleaved
    yield list(range(16)), 16  # every row its own adapter
    yield [s for s in range(8) for _ in range(17)], 8  # the worst case: 17 rows each
    for _ in range(50):
        slots = rng.choice([1, 2, 8, 64])
        rows = rng.randint(1, 258)
        yield [rng.randint(-1, slots - 1) for _ in range(rows)], slots


@pytest.mark.parametrize("row_slots,slots", list(patterns()))
def test_every_adapter_row_once_in_a_dense_block_of_its_slot(row_slots, slots):
    blocks = blocks_of(row_slots, slots)
    seen = []
    for slot, rows in blocks:
        if not rows:
            assert slot == -1  # an unused block names no slot
            continue
        assert len(rows) <= DECODE_BLOCK_M
        assert all(row_slots[r] == slot for r in rows)
        seen += rows
    assert sorted(seen) == [r for r, s in enumerate(row_slots) if s >= 0]
    # grouped: a slot's blocks are consecutive, all full but its last
    used = [(slot, rows) for slot, rows in blocks if rows]
    order = [slot for slot, _ in used]
    assert order == sorted(order)
    for i, (slot, rows) in enumerate(used[:-1]):
        if used[i + 1][0] == slot:
            assert len(rows) == DECODE_BLOCK_M
