"""The host-memory KV tier: a copy of the device KV pool's layout in (pinned) host memory.

Generic over the device pool: it sees only the pool's buffers (`kv_buffers(pool)`), each
`[slots + 1, ...]` with slot i's values in row i, whatever the layout (per-layer K and V, one
latent MLA buffer per layer, FP8 or not), and keeps one host buffer of the same row shape and
dtype per device buffer, so a copy either way is a row gather and a row scatter per buffer
(typed rows: a byte-wise copy is several times slower on the CPU). The disk tier sees a token
as its raw bytes across every buffer, side by side (`gather`, `write`), and never needs to know
what the bytes mean.

Copies to the host (back-ups) run on the compute stream, after the forward passes that wrote
the slots, straight into the page-locked host rows (one copy per run of consecutive host slots
and buffer); copies back (restores) run on the tier's own stream after the compute stream's
work so far, and the compute stream waits for them before its next pass. The host waits for
neither. On the CPU every copy is a plain synchronous copy.
"""

from __future__ import annotations

import math
import mmap
import time
import weakref

import torch

from radixserve.mem_cache.allocator import TokenSlotAllocator


def kv_buffers(pool: object) -> list[torch.Tensor]:
    """Every device buffer of a KV pool, slot-major. A pool with another layout (a latent MLA
    pool) names its buffers with `kv_buffers()`; TokenToKVPool has per-layer K and V."""
    named = getattr(pool, "kv_buffers", None)
    if callable(named):
        return list(named())
    return [*pool.k_buffers, *pool.v_buffers]  # type: ignore[attr-defined]


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


# above this many runs of host slots in one copy, a gather beats one copy per run
MAX_RUNS = 64


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


class HostKVPool:
    """`size` host slots mirroring one token's KV across all of a device pool's buffers."""

    def __init__(self, device_pool: object, size: int) -> None:
        self._device_buffers = kv_buffers(device_pool)
        self.device = self._device_buffers[0].device
        self.is_cuda = self.device.type == "cuda"
        self.widths = [_row_bytes(b) for b in self._device_buffers]
        self.bytes_per_token = sum(self.widths)
        self.size = size
        # row 0 unused, as on the device: host slots are 1..size like device slots
        self._host_buffers = [
            _host_buffer((size + 1, *b.shape[1:]), b.dtype, pinned=self.is_cuda)
            for b in self._device_buffers
        ]
        self.allocator = TokenSlotAllocator(size)
        self._load_stream = torch.cuda.Stream(self.device) if self.is_cuda else None
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
        slots and buffer; the host does not wait. A restore's stream waits for the compute
        stream first, so it reads the rows only once they are there."""
        if device_slots.numel() == 0:
            return
        if not self.is_cuda:
            for device, host in zip(self._device_buffers, self._host_buffers, strict=True):
                host.index_copy_(0, host_slots, device.index_select(0, device_slots))
            return
        index = device_slots.to(self.device, non_blocking=True)
        runs = _runs(host_slots)
        for device, host in zip(self._device_buffers, self._host_buffers, strict=True):
            rows = device.index_select(0, index)
            if len(runs) > MAX_RUNS:  # fragmented host slots: one waited-for copy, a scatter
                host.index_copy_(0, host_slots, rows.cpu())
                continue
            for offset, first, length in runs:
                host[first : first + length].copy_(
                    rows[offset : offset + length], non_blocking=True
                )

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
            # a back-up still in flight may target these rows (their node was dropped since):
            # it lands first (a disk read is no fast path anyway)
            torch.cuda.current_stream(self.device).synchronize()
        n = host_slots.numel()
        offset = 0
        for host, width in zip(self._host_buffers, self.widths, strict=True):
            part = data[:, offset : offset + width].contiguous().view(host.dtype)
            host.index_copy_(0, host_slots, part.view(n, *host.shape[1:]))
            offset += width

    # --- host -> device --------------------------------------------------------------------

    def restore(self, host_slots: torch.Tensor, device_slots: torch.Tensor) -> None:
        """Copy `host_slots` back into `device_slots`. On CUDA on the tier's own stream, one
        copy per run of host slots and buffer from the page-locked rows into a device staging
        buffer, then a scatter: the compute stream waits for it before its next pass, the host
        does not wait at all."""
        if host_slots.numel() == 0:
            return
        if not self.is_cuda:
            start = time.perf_counter()
            for device, host in zip(self._device_buffers, self._host_buffers, strict=True):
                device.index_copy_(0, device_slots, host.index_select(0, host_slots))
            self._restore_seconds.append(time.perf_counter() - start)
            return
        compute = torch.cuda.current_stream(self.device)
        stream = self._load_stream
        assert stream is not None
        # after the passes launched so far (the target slots may be ones they just gave up)
        # and the back-ups that wrote these host rows
        stream.wait_stream(compute)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        runs = _runs(host_slots)
        n = host_slots.numel()
        with torch.cuda.stream(stream):
            begin.record()
            index = device_slots.to(self.device, non_blocking=True)
            for device, host in zip(self._device_buffers, self._host_buffers, strict=True):
                if len(runs) > MAX_RUNS:  # fragmented host slots: a gather on the host
                    pinned = host.index_select(0, host_slots).pin_memory()
                    device.index_copy_(0, index, pinned.to(self.device, non_blocking=True))
                    continue
                staging = torch.empty(
                    (n, *device.shape[1:]), dtype=device.dtype, device=self.device
                )
                for offset, first, length in runs:
                    staging[offset : offset + length].copy_(
                        host[first : first + length], non_blocking=True
                    )
                device.index_copy_(0, index, staging)
            end.record()
        # the next pass, and any later back-up into these host rows, wait for the copy
        compute.wait_event(end)
        self._restore_timings.append((begin, end))

    def pop_restore_seconds(self) -> list[float]:
        """Durations of the restores finished since the last call (the latency histogram)."""
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
