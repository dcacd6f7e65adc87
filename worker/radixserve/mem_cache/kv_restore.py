"""A restore from the host KV tier in flight, as the forward pass that needs it sees it.

The host tier copies an admission round's restored pages back on its own stream, one layer
group after another, and records an event after each group (host_pool.py). The pass that
admitted those requests is launched at once and its layer i waits, on the compute stream, only
for layer i's group: the prefill of the uncached suffix (and every other row of the pass)
overlaps the copies of the later layers instead of waiting for the whole prefix.

A pass with no restore carries None: nothing here runs, no event exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class StreamEvent(Protocol):
    """What a restore needs of an event: torch.cuda.Event, or a test's stand-in."""

    def record(self) -> None:
        """Mark the work queued so far on the current stream (the copy stream)."""
        ...

    def wait(self) -> None:
        """Make the current stream wait until the event's work is done (the host never waits)."""
        ...


class KVRestore:
    """One event per layer group, recorded on the copy stream in group order once that group's
    rows are in the device pool; `layer_group[layer]` names a layer's group. Events on one
    stream complete in order, so waiting for group g covers every group before it: each
    event is waited for at most once per pass, whatever order the layers come in."""

    def __init__(self, events: Sequence[StreamEvent], layer_group: Sequence[int]) -> None:
        if not events:
            raise ValueError("a restore has at least one layer group")
        self._events = list(events)
        self._layer_group = list(layer_group)
        self._waited = -1  # the last group the compute stream waits for

    def wait(self, layer_id: int) -> None:
        """Before layer `layer_id` reads the KV pool: the current stream waits for its group."""
        self._wait_group(self._layer_group[layer_id])

    def wait_all(self) -> None:
        """Every group: for a pass that cannot wait layer by layer (a replayed CUDA graph), and
        after an eager one, so that nothing later on the stream runs ahead of the copies."""
        self._wait_group(len(self._events) - 1)

    def _wait_group(self, group: int) -> None:
        if group > self._waited:
            self._events[group].wait()
            self._waited = group
