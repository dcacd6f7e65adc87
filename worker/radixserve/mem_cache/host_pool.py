"""The host-memory KV tier: a copy of the device KV pool's layout in (pinned) host memory.

Generic over the device pool: it sees only the pool's buffers (`kv_buffers(pool)`), each
`[slots + 1, ...]` with slot i's values in row i, whatever the layout (per-layer K and V, one
latent MLA buffer per layer, FP8 or not), and which layer each belongs to (`buffer_layers`).
The layers are cut into `RESTORE_GROUPS` consecutive groups, and a host slot holds, per group,
one row of the raw bytes of the group's buffers side by side: a run of consecutive host slots is
then one contiguous block per group, so moving it is one large copy per group, not one small
copy per buffer (the copies of a restore were small and many, and the host issuing them was what
bounded its bandwidth). Each device buffer also has a typed view into its group's rows, for the
disk tier, which sees a token as its raw bytes across every buffer in `kv_buffers` order
(`gather`, `read`, `write`) and never needs to know what the bytes mean.

Copies to the host (back-ups) run on the compute stream, after the forward passes that wrote
the slots, straight into the page-locked host rows (one copy per run of consecutive host slots
and group). Copies back (restores) are queued while an admission round restores prefixes and
issued together when its pass launches (`issue_restores`): on the tier's own stream, after the
compute stream's work so far, group after group, each group's rows staged on the device and
scattered into the pool, then an event; the pass waits for each layer's group just before that
layer reads the pool (`kv_restore.KVRestore`). The host waits for neither. On the CPU every
copy is a plain synchronous copy.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import time
import weakref
from collections.abc import Callable

import torch

from radixserve.mem_cache.allocator import TokenSlotAllocator
from radixserve.mem_cache.kv_restore import KVRestore, StreamEvent

# Layer groups of a restore: each costs one copy per run of host slots and one event. More
# groups let a pass start sooner (it waits for 1/groups of the bytes before its first layer);
# fewer make larger copies and fewer calls for the host to issue.
RESTORE_GROUPS = 8
# One copy per run of consecutive host slots, unless the runs are many and short: past
# MAX_RUNS runs averaging under SHORT_RUN tokens, one gather on the host and one copy beat them.
# (A round's restore is many runs, one per node of each prefix, but long ones: they stay copies.)
MAX_RUNS = 64
SHORT_RUN = 4
# A back-up or restore stages at most this many bytes of a group on the device at a time,
# however many tokens an admission round restores.
STAGING_BYTES = 64 << 20


def kv_buffers(pool: object) -> list[torch.Tensor]:
    """Every device buffer of a KV pool, slot-major. A pool with another layout (a latent MLA
    pool) names its buffers with `kv_buffers()`; TokenToKVPool has per-layer K and V."""
    named = getattr(pool, "kv_buffers", None)
    if callable(named):
        return list(named())
    return [*pool.k_buffers, *pool.v_buffers]  # type: ignore[attr-defined]


def buffer_layers(pool: object) -> list[int]:
    """The layer each of `kv_buffers(pool)` belongs to: buffer j is layer j modulo the pool's
    layer count (per-layer K then per-layer V, or one latent buffer per layer)."""
    num_layers = len(pool.k_buffers)  # type: ignore[attr-defined]
    return [j % num_layers for j in range(len(kv_buffers(pool)))]


def _row_bytes(buffer: torch.Tensor) -> int:
    return buffer[0].numel() * buffer.element_size()


def _host_buffer(shape: tuple[int, ...], dtype: torch.dtype, pinned: bool) -> torch.Tensor:
    """A zeroed host buffer; `pinned`: page-locked in place with cudaHostRegister (torch's
    pin_memory allocates through its caching host allocator, which rounds a block up to a
    power of two: up to twice the memory asked for). A pinned buffer is an anonymous mapping
    of its own: a range that shares a page with memory registered before (small tensors from
    malloc do, and freed ones come back) fails to register, and the failed call's error is
    what the next kernel launch in the process reports. It is unregistered when it goes."""
    if not pinned:
        return torch.zeros(shape, dtype=dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    mapping = mmap.mmap(-1, max(nbytes, 1))  # zero-filled, page-aligned, kept by the tensor
    buffer = torch.frombuffer(mapping, dtype=torch.uint8)[:nbytes].view(dtype).view(shape)
    if nbytes:
        cudart = torch.cuda.cudart()
        if int(cudart.cudaHostRegister(buffer.data_ptr(), nbytes, 0)) != 0:
            raise RuntimeError(f"cannot page-lock {nbytes >> 20} MiB for the host KV tier")
        weakref.finalize(buffer, cudart.cudaHostUnregister, buffer.data_ptr())
    return buffer


def _runs(slots: torch.Tensor) -> list[tuple[int, int, int]]:
    """(offset in `slots`, first slot, length) of each run of consecutive slots: a node's host
    slots are a few runs, each one plain copy between pinned host memory and the device."""
    if slots.numel() == 0:
        return []
    breaks = (torch.nonzero(slots[1:] - slots[:-1] != 1).flatten() + 1).tolist()
    starts = [0, *breaks]
    ends = [*breaks, slots.numel()]
    first = slots[starts].tolist()
    return [(s, f, e - s) for s, f, e in zip(starts, first, ends, strict=True)]


def _fragmented(runs: list[tuple[int, int, int]], num_slots: int) -> bool:
    return len(runs) > MAX_RUNS and num_slots < SHORT_RUN * len(runs)


def _typed(rows: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """The columns of byte `rows` ([n, group bytes]) from `offset` that hold buffer `like`'s
    row, seen as `like`'s rows ([n, *like.shape[1:]], its dtype): a view, no copy."""
    width = _row_bytes(like)
    return rows[:, offset : offset + width].view(like.dtype).view(rows.shape[0], *like.shape[1:])


class HostKVPool:
    """`size` host slots mirroring one token's KV across all of a device pool's buffers.

    `new_event` makes the events a restore records after each layer group (default: CUDA
    events on CUDA, none on the CPU, where copies are synchronous); a test passes its own to
    watch the order of copies and events without a GPU."""

    def __init__(
        self,
        device_pool: object,
        size: int,
        new_event: Callable[[], StreamEvent] | None = None,
    ) -> None:
        buffers = kv_buffers(device_pool)
        self._device_buffers = buffers
        self.device = buffers[0].device
        self.is_cuda = self.device.type == "cuda"
        self.widths = [_row_bytes(b) for b in buffers]
        self.bytes_per_token = sum(self.widths)
        self.size = size
        layers = buffer_layers(device_pool)
        num_layers = max(layers) + 1
        groups = min(RESTORE_GROUPS, num_layers)
        self.layer_group = [layer * groups // num_layers for layer in range(num_layers)]
        # each group's buffers (indices into kv_buffers) and their byte offsets in its rows
        self._groups: list[list[tuple[int, int]]] = [[] for _ in range(groups)]
        group_bytes = [0] * groups
        places = []  # each buffer's (group, offset)
        for j, layer in enumerate(layers):
            group = self.layer_group[layer]
            self._groups[group].append((j, group_bytes[group]))
            places.append((group, group_bytes[group]))
            group_bytes[group] += self.widths[j]
        self._chunk_tokens = max(1, STAGING_BYTES // max(group_bytes))
        # row 0 unused, as on the device: host slots are 1..size like device slots
        self._group_rows = [
            _host_buffer((size + 1, nbytes), torch.uint8, pinned=self.is_cuda)
            for nbytes in group_bytes
        ]
        self._host_buffers = [
            _typed(self._group_rows[group], offset, buffer)
            for buffer, (group, offset) in zip(buffers, places, strict=True)
        ]
        self.allocator = TokenSlotAllocator(size)
        self._load_stream = torch.cuda.Stream(self.device) if self.is_cuda else None
        if new_event is None and self.is_cuda:
            new_event = torch.cuda.Event
        self._new_event = new_event
        # restores queued this admission round: (host slots, device slots)
        self._queued: list[tuple[torch.Tensor, torch.Tensor]] = []
        # (start, end) events of restores whose duration is not read yet (CUDA), or seconds
        self._restore_timings: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._restore_seconds: list[float] = []

    @staticmethod
    def slots_for_bytes(device_pool: object, num_bytes: float) -> int:
        """How many host slots `num_bytes` of host memory hold for this pool's layout."""
        return int(num_bytes // sum(_row_bytes(b) for b in kv_buffers(device_pool)))

    def available_size(self) -> int:
        return self.allocator.available_size()

    def used_size(self) -> int:
        return self.size - self.allocator.available_size()

    # --- device -> host --------------------------------------------------------------------

    def backup(self, device_slots: torch.Tensor, host_slots: torch.Tensor) -> None:
        """Copy the KV of `device_slots` into `host_slots`. On CUDA on the compute stream,
        after every pass already launched there (they wrote the slots) and before any later
        one (it may reuse them), straight into the page-locked rows, one copy per run of host
        slots and group; the host does not wait. A restore's stream waits for the compute
        stream first, so it reads the rows only once they are there."""
        if device_slots.numel() == 0:
            return
        parts = self._parts(device_slots.to(self.device, non_blocking=True), host_slots)
        for group, members in enumerate(self._groups):
            host = self._group_rows[group]
            for index, slots, runs in parts:
                rows = torch.cat(
                    [
                        self._device_buffers[j].index_select(0, index).view(index.numel(), -1)
                        .view(torch.uint8)
                        for j, _ in members
                    ],
                    dim=1,
                )  # fmt: skip
                if not self.is_cuda:
                    host.index_copy_(0, slots, rows)
                elif _fragmented(runs, index.numel()):  # one waited-for copy, a scatter
                    host.index_copy_(0, slots, rows.cpu())
                else:
                    for offset, first, length in runs:
                        host[first : first + length].copy_(
                            rows[offset : offset + length], non_blocking=True
                        )

    def _parts(
        self, index: torch.Tensor, host_slots: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor, list[tuple[int, int, int]]]]:
        """(device slots, host slots, runs of the host slots) of each staging-sized piece of
        a copy (`STAGING_BYTES` of a group)."""
        step = self._chunk_tokens
        return [
            (index[start : start + step], host_slots[start : start + step],
             _runs(host_slots[start : start + step]))
            for start in range(0, host_slots.numel(), step)
        ]  # fmt: skip

    # --- raw bytes (the disk tier) ---------------------------------------------------------

    def gather(self, device_slots: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """The raw bytes of `device_slots` ([n, bytes_per_token]) in a fresh host tensor, and
        on CUDA the event after which they are there (the disk writer waits for it, the step
        loop does not)."""
        index = device_slots.to(self.device, non_blocking=True)
        n = index.numel()
        rows = [
            b.index_select(0, index).view(n, -1).view(torch.uint8) for b in self._device_buffers
        ]
        gathered = torch.cat(rows, dim=1)
        if not self.is_cuda:
            return gathered, None
        staging = torch.empty(gathered.shape, dtype=torch.uint8, pin_memory=True)
        staging.copy_(gathered, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return staging, done

    def read(self, host_slots: torch.Tensor) -> torch.Tensor:
        """The raw bytes of `host_slots` ([n, bytes_per_token]), as `gather` lays them out."""
        if self.is_cuda:
            torch.cuda.current_stream(self.device).synchronize()  # back-ups in flight land
        n = host_slots.numel()
        return torch.cat(
            [
                h.index_select(0, host_slots).view(n, -1).view(torch.uint8)
                for h in self._host_buffers
            ],
            dim=1,
        )

    def write(self, host_slots: torch.Tensor, data: torch.Tensor) -> None:
        """Store raw bytes (a disk block, laid out as `gather` does) into `host_slots`."""
        if self.is_cuda:
            # a back-up still in flight may target these rows (their node was dropped since),
            # and so may the read of a restore whose pass waits for it: both land first (a
            # disk read is no fast path anyway)
            torch.cuda.current_stream(self.device).synchronize()
        n = host_slots.numel()
        offset = 0
        for host, width in zip(self._host_buffers, self.widths, strict=True):
            part = data[:, offset : offset + width].contiguous().view(host.dtype)
            host.index_copy_(0, host_slots, part.view(n, *host.shape[1:]))
            offset += width

    # --- host -> device --------------------------------------------------------------------

    def queue_restore(self, host_slots: torch.Tensor, device_slots: torch.Tensor) -> None:
        """Copy `host_slots` back into `device_slots` when the pass that needs them launches
        (`issue_restores`): a round's restores then move as one copy per run and group."""
        if host_slots.numel():
            self._queued.append((host_slots, device_slots))

    def cancel_restores(self, device_slots: torch.Tensor) -> None:
        """Queued restores no longer write `device_slots`: their node left the device before
        the copies were issued, and the slots may be handed out again (to this very round's
        new tokens, which the pass writes without waiting for the copies)."""
        if not self._queued:
            return
        kept = []
        for host, device in self._queued:
            keep = ~torch.isin(device, device_slots)
            if bool(keep.any()):
                kept.append((host[keep], device[keep]))
        self._queued = kept

    def issue_restores(self) -> KVRestore | None:
        """Issue the queued restores; the `KVRestore` the pass about to launch waits on, layer
        by layer (None on the CPU, where the copies are done on return, or with none queued).

        On CUDA on the tier's stream, after the compute stream's work so far (the passes
        launched before may still read slots that were evicted to make room, or back up the
        host rows read here): per layer group, one copy per run of host slots into a device
        staging buffer (a fragmented run list: one gather on the host), a scatter into each of
        the group's pool buffers, then the group's event. The host does not wait."""
        if not self._queued:
            return None
        host_slots = torch.cat([host for host, _ in self._queued])
        device_slots = torch.cat([device for _, device in self._queued])
        self._queued = []
        stream = self._load_stream
        context: contextlib.AbstractContextManager = contextlib.nullcontext()
        begin = end = None
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))
            context = torch.cuda.stream(stream)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start = time.perf_counter()
        events = []
        with context:
            if begin is not None:
                begin.record()
            parts = self._parts(device_slots.to(self.device, non_blocking=True), host_slots)
            for group, members in enumerate(self._groups):
                for index, slots, runs in parts:
                    rows = self._stage(group, slots, runs)
                    for j, offset in members:
                        buffer = self._device_buffers[j]
                        buffer.index_copy_(0, index, _typed(rows, offset, buffer))
                if self._new_event is not None:
                    event = self._new_event()
                    event.record()
                    events.append(event)
            if end is not None:
                end.record()
        if begin is not None and end is not None:
            self._restore_timings.append((begin, end))
        else:
            self._restore_seconds.append(time.perf_counter() - start)
        return KVRestore(events, self.layer_group) if events else None

    def _stage(
        self, group: int, host_slots: torch.Tensor, runs: list[tuple[int, int, int]]
    ) -> torch.Tensor:
        """The group's rows of `host_slots` on the device ([n, group bytes])."""
        host = self._group_rows[group]
        if not self.is_cuda:
            return host.index_select(0, host_slots)
        if _fragmented(runs, host_slots.numel()):  # a gather on the host, one copy
            return host.index_select(0, host_slots).pin_memory().to(self.device, non_blocking=True)
        rows = torch.empty(
            (host_slots.numel(), host.shape[1]), dtype=torch.uint8, device=self.device
        )
        for offset, first, length in runs:
            rows[offset : offset + length].copy_(host[first : first + length], non_blocking=True)
        return rows

    def pop_restore_seconds(self) -> list[float]:
        """Durations of the restores (one per issued admission round) finished since the last
        call (the latency histogram)."""
        done = self._restore_seconds
        self._restore_seconds = []
        waiting = []
        for begin, end in self._restore_timings:
            if end.query():
                done.append(begin.elapsed_time(end) / 1000.0)
            else:
                waiting.append((begin, end))
        self._restore_timings = waiting
        return done

    def clear(self) -> None:
        self.allocator.clear()
        self._queued = []
