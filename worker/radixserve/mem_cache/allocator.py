"""Allocator of KV-cache slot indices.

The free list lives on the CPU so that allocation and freeing never wait on the device: the
scheduler allocates slots for a whole batch before the previous forward pass has finished
(SGLang #1557). Slot 0 is never handed out: padded tokens (CUDA graph padding) write there.
"""

from __future__ import annotations

import torch

# freed tensors kept apart before they are joined to the free list in one copy
MAX_RETURNED_TENSORS = 1024


class TokenSlotAllocator:
    """KV slot indices 1..size are allocatable; slot 0 is reserved (padding writes go there).

    The free list is a CPU int64 torch tensor: alloc is a slice; freed slots are kept as the
    tensors they came in and joined to the free list only when a slice runs short (or too many
    wait), so a free costs O(1), not a copy of the whole list: a speculative verify step gives
    back its rejected slots every step. Never a device sync.
    """

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"allocator size must be >= 0, got {size}")
        self.size = size
        self._free_slots = torch.empty(0, dtype=torch.int64)
        self._is_in_free_group = False
        self._free_group: list[torch.Tensor] = []
        # freed since the free list was last rebuilt, and how many slots they hold
        self._returned: list[torch.Tensor] = []
        self._returned_count = 0
        self.clear()

    def available_size(self) -> int:
        """Free slots; slots freed inside an open free group are not counted until it closes."""
        return int(self._free_slots.numel()) + self._returned_count

    def alloc(self, n: int) -> torch.Tensor | None:
        """Take `n` slots off the front of the free list; None (and nothing taken) if too few."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of slots: {n}")
        if n > self._free_slots.numel():
            self._join_returned()
        if n > self._free_slots.numel():
            return None
        taken = self._free_slots[:n]
        self._free_slots = self._free_slots[n:]
        return taken

    def free(self, indices: torch.Tensor) -> None:
        """Return slots to the free list (CPU int64); an empty tensor is a no-op."""
        if indices.numel() == 0:
            return
        indices = indices.to(device="cpu", dtype=torch.int64).reshape(-1)
        if self._is_in_free_group:
            self._free_group.append(indices)
        else:
            self._return(indices)

    def _return(self, indices: torch.Tensor) -> None:
        self._returned.append(indices)
        self._returned_count += int(indices.numel())
        if len(self._returned) >= MAX_RETURNED_TENSORS:
            self._join_returned()

    def _join_returned(self) -> None:
        """Append the freed slots to the free list, in the order they were freed."""
        if self._returned:
            self._free_slots = torch.cat((self._free_slots, *self._returned))
            self._returned = []
            self._returned_count = 0

    def free_group_begin(self) -> None:
        """Collect the following free() calls and concatenate them once, at free_group_end()."""
        self._is_in_free_group = True
        self._free_group = []

    def free_group_end(self) -> None:
        """Close the group opened by free_group_begin() and release its slots in one step."""
        self._is_in_free_group = False
        if self._free_group:
            self._return(torch.cat(self._free_group))
        self._free_group = []

    def clear(self) -> None:
        """Mark every slot 1..size free again (server start, /flush_cache)."""
        self._free_slots = torch.arange(1, self.size + 1, dtype=torch.int64)
        self._returned = []
        self._returned_count = 0
        self._is_in_free_group = False
        self._free_group = []

    def free_slots(self) -> torch.Tensor:
        """A copy of the free list, for invariant checks and debugging."""
        return torch.cat((self._free_slots, *self._returned))

    def check_no_duplicates(self) -> None:
        """Raise AssertionError unless the free list (and any open free group) holds distinct
        values within 1..size.

        A debug check: a double free or a freed padding slot shows up here long before it
        corrupts another request's KV.
        """
        slots = torch.cat((self._free_slots, *self._returned, *self._free_group))
        if slots.numel() == 0:
            return
        if int(slots.min()) < 1 or int(slots.max()) > self.size:
            raise AssertionError(f"free list holds a slot outside 1..{self.size}")
        if torch.unique(slots).numel() != slots.numel():
            raise AssertionError("free list holds a slot twice (double free)")
