"""TokenSlotAllocator: slot 0 is never handed out, nothing leaks, free groups batch frees."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.mem_cache.allocator import TokenSlotAllocator


def test_alloc_hands_out_distinct_slots_and_never_slot_zero() -> None:
    allocator = TokenSlotAllocator(8)
    slots = allocator.alloc(8)
    assert slots is not None
    assert slots.dtype == torch.int64 and slots.device.type == "cpu"
    assert sorted(slots.tolist()) == list(range(1, 9))
    assert allocator.available_size() == 0


def test_alloc_beyond_capacity_returns_none_and_takes_nothing() -> None:
    allocator = TokenSlotAllocator(4)
    assert allocator.alloc(5) is None
    assert allocator.available_size() == 4
    first = allocator.alloc(3)
    assert first is not None
    assert allocator.alloc(2) is None
    assert allocator.available_size() == 1


def test_alloc_zero_is_empty() -> None:
    allocator = TokenSlotAllocator(4)
    slots = allocator.alloc(0)
    assert slots is not None and slots.numel() == 0
    assert allocator.available_size() == 4


def test_free_returns_slots_and_accepts_empty() -> None:
    allocator = TokenSlotAllocator(6)
    slots = allocator.alloc(4)
    assert slots is not None
    allocator.free(torch.empty(0, dtype=torch.int64))
    assert allocator.available_size() == 2
    allocator.free(slots[:2])
    assert allocator.available_size() == 4
    assert set(allocator.free_slots().tolist()) == {5, 6, *slots[:2].tolist()}
    allocator.check_no_duplicates()


def test_free_group_defers_until_end() -> None:
    allocator = TokenSlotAllocator(6)
    slots = allocator.alloc(6)
    assert slots is not None
    allocator.free_group_begin()
    allocator.free(slots[:2])
    allocator.free(slots[2:3])
    allocator.free(torch.empty(0, dtype=torch.int64))
    assert allocator.available_size() == 0
    allocator.free_group_end()
    assert sorted(allocator.free_slots().tolist()) == sorted(slots[:3].tolist())
    allocator.free_group_end()  # an empty group is harmless
    assert allocator.available_size() == 3


def test_clear_makes_everything_free_again() -> None:
    allocator = TokenSlotAllocator(5)
    allocator.alloc(3)
    allocator.clear()
    assert sorted(allocator.free_slots().tolist()) == [1, 2, 3, 4, 5]


def test_check_no_duplicates_catches_a_double_free() -> None:
    allocator = TokenSlotAllocator(4)
    slots = allocator.alloc(2)
    assert slots is not None
    allocator.free(slots)
    allocator.check_no_duplicates()
    allocator.free(slots[:1])
    with pytest.raises(AssertionError, match="twice"):
        allocator.check_no_duplicates()


def test_check_no_duplicates_catches_slot_zero() -> None:
    allocator = TokenSlotAllocator(4)
    allocator.free(torch.tensor([0]))
    with pytest.raises(AssertionError, match="outside"):
        allocator.check_no_duplicates()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 6)), max_size=30))
def test_random_alloc_free_never_leaks(ops: list[tuple[bool, int]]) -> None:
    size = 16
    allocator = TokenSlotAllocator(size)
    held: list[int] = []
    for is_alloc, n in ops:
        if is_alloc:
            slots = allocator.alloc(n)
            if n > size - len(held):
                assert slots is None
            else:
                assert slots is not None
                held.extend(slots.tolist())
        else:
            released, held = held[:n], held[n:]
            allocator.free(torch.tensor(released, dtype=torch.int64))
        allocator.check_no_duplicates()
        assert len(set(held)) == len(held)
        assert sorted(held + allocator.free_slots().tolist()) == list(range(1, size + 1))
