"""FutureTokens: tokens that launched batches sampled and the host has not fetched yet.

With overlap scheduling the scheduler forms batch N+1 while the device still runs batch N, so
N+1's input ids cannot hold N's tokens. Each launched batch reserves one slot per row in a
device-side ring; the row's sampled token is stored there on the device, and until the host
has it, the scheduler feeds a *placeholder* input id that names the slot. A pass resolves its
placeholders on the device before the embedding lookup.

This class is the only thing that knows how slots and placeholders are laid out (a ring of
int64 ids, placeholders are negative slot numbers, slot 0 is never handed out); the scheduler,
the worker, the graph runner and the benchmark only pass `FutureSlots` and placeholders around.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.kernels.argmax import argmax


@dataclass(frozen=True)
class FutureSlots:
    """The consecutive ring slots one launched batch reserved: row i's token goes to
    slot `start + i`."""

    start: int
    count: int

    def placeholder(self, row: int) -> int:
        """The input id that stands for row `row`'s token until the host has it."""
        return -(self.start + row)

    def write_slots(self, out: torch.Tensor) -> None:
        """Fill `out` ([count] int64, on the host) with the rows' slot numbers: what a
        captured decode graph indexes the ring with."""
        torch.arange(self.start, self.start + self.count, out=out)


NO_SLOTS = FutureSlots(0, 0)


class FutureTokens:
    """The device ring of future token ids and its host-side allocation cursor."""

    # At most two batches are unresolved at once (overlap): a ring of four batch-widths never
    # reuses a slot a pending row still names.
    BATCHES_IN_RING = 4

    def __init__(self, max_batch_size: int, device: torch.device) -> None:
        self.ids = torch.zeros(
            self.BATCHES_IN_RING * max_batch_size + 1, dtype=torch.int64, device=device
        )
        self._next = 1  # slot 0 is the padding rows' target: never reserved

    def reserve(self, n: int) -> FutureSlots:
        """Slots for a batch of `n` rows about to launch."""
        if self._next + n > self.ids.numel():
            self._next = 1
        slots = FutureSlots(self._next, n)
        self._next += n
        return slots

    def store(self, slots: FutureSlots, token_ids: torch.Tensor) -> None:
        """Put a launched batch's samples (on the device) into its slots."""
        self.ids[slots.start : slots.start + token_ids.numel()] = token_ids

    def store_greedy(self, logits: torch.Tensor, slot_index: torch.Tensor) -> torch.Tensor:
        """The greedy choice of each row of `logits`, also stored at `slot_index[row]` (device
        int64) in the same kernel: how a captured decode step ends."""
        return argmax(logits, scatter_to=(self.ids, slot_index))

    def resolve(self, input_ids: torch.Tensor) -> torch.Tensor:
        """`input_ids` with every placeholder replaced by its token, looked up on the device."""
        return torch.where(input_ids < 0, self.ids[(-input_ids).clamp(min=0)], input_ids)
