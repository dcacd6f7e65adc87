"""The two device-side pools: request rows of KV slot indices, and the K/V tensors themselves.

`ReqToTokenPool` maps (running request, token position) -> KV slot; attention kernels read it on
the device. `TokenToKVPool` holds the per-layer K and V values addressed by those slots.
"""

from __future__ import annotations

import torch

from radixserve.layers import fused_ops
from radixserve.utils import device_tensor


class ReqToTokenPool:
    """[size, max_context_len] int32 on the device: row = running request, entry = KV slot of
    that token.

    A CPU mirror is kept so the scheduler reads rows without a device sync; writes go to both.
    On a CPU device the mirror *is* the device tensor and each write happens once.
    """

    def __init__(self, size: int, max_context_len: int, device: str | torch.device) -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.device = torch.device(device)
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32, device=device)
        self._mirror_is_device = self.device.type == "cpu"
        self._cpu_mirror = (
            self.req_to_token
            if self._mirror_is_device
            else torch.zeros((size, max_context_len), dtype=torch.int32)
        )
        self._free_rows: list[int] = []
        self.clear()

    def available_size(self) -> int:
        """Rows not held by any request."""
        return len(self._free_rows)

    def alloc(self, n: int) -> list[int] | None:
        """Take `n` free rows; None (and nothing taken) if fewer than `n` are free."""
        if n > len(self._free_rows):
            return None
        taken = self._free_rows[:n]
        self._free_rows = self._free_rows[n:]
        return taken

    def free(self, idx: int | list[int]) -> None:
        """Give one row or a list of rows back."""
        if isinstance(idx, int):
            self._free_rows.append(idx)
        else:
            self._free_rows.extend(idx)

    def write(self, req_idx: int, start: int, indices: torch.Tensor) -> None:
        """Set row[req_idx][start:start + len(indices)] = indices."""
        self.write_batch([req_idx], [start], [indices])

    def write_batch(
        self, req_indices: list[int], starts: list[int], indices: list[torch.Tensor]
    ) -> None:
        """Write several rows' runs of slots with a single device index_put.

        The flat (row, column) index is built on the CPU, so a batch of N requests costs one
        host-to-device copy and one kernel instead of N of each.
        """
        if not req_indices:
            return
        lengths = torch.tensor([t.numel() for t in indices], dtype=torch.int64)
        rows = torch.repeat_interleave(torch.tensor(req_indices, dtype=torch.int64), lengths)
        # column of each value: its offset within its run, plus the run's start
        run_offsets = torch.cumsum(lengths, 0) - lengths
        shift = torch.tensor(starts, dtype=torch.int64) - run_offsets
        cols = torch.arange(int(lengths.sum()), dtype=torch.int64) + torch.repeat_interleave(
            shift, lengths
        )
        values = torch.cat([t.to(device="cpu", dtype=torch.int32) for t in indices])
        self._put(rows, cols, values)

    def write_columns(
        self,
        req_indices: list[int],
        cols: list[int],
        values: torch.Tensor,
        mirror_only: bool = False,
    ) -> None:
        """One slot per row (a decode step): row req_indices[i] gets values[i] at cols[i].

        `mirror_only` leaves the device table to the decode pass, which stores the same cells
        from the inputs it copies to the device anyway (`store_decode_slots`): a step then
        pays no host-to-device copy and no index_put for them."""
        if not req_indices:
            return
        rows = torch.tensor(req_indices, dtype=torch.int64)
        col_ids = torch.tensor(cols, dtype=torch.int64)
        values = values.to(device="cpu", dtype=torch.int32)
        if mirror_only:
            self._cpu_mirror[rows, col_ids] = values
        else:
            self._put(rows, col_ids, values)

    def store_decode_slots(
        self, req_indices: torch.Tensor, cols: torch.Tensor, values: torch.Tensor
    ) -> None:
        """The device half of `write_columns(..., mirror_only=True)`, from device tensors
        (a decode pass's request rows, positions and KV slots). On a CPU device the mirror
        is the table: the host write already made it."""
        if not self._mirror_is_device:
            fused_ops.store_cells(self.req_to_token, req_indices, cols, values)

    def _put(self, rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor) -> None:
        """Write the mirror now and queue the device write behind the work in flight: one
        host-to-device copy (rows, columns and values packed) and one index_put, no host sync."""
        self._cpu_mirror[rows, cols] = values
        if not self._mirror_is_device:
            packed = device_tensor(
                torch.stack([rows.to(torch.int32), cols.to(torch.int32), values]),
                torch.int32,
                self.device,
            )
            self.req_to_token.index_put_((packed[0], packed[1]), packed[2])

    def read(self, req_idx: int, end: int) -> torch.Tensor:
        """row[req_idx][:end] as a fresh CPU int64 tensor, read from the mirror (no device sync)."""
        return self._cpu_mirror[req_idx, :end].to(torch.int64)

    def clear(self) -> None:
        """Free every row (server start, /flush_cache)."""
        self._free_rows = list(range(self.size))


class TokenToKVPool:
    """Per-layer K and V buffers [size + 1, num_kv_heads, head_dim]; slot 0 is the padding target."""

    def __init__(
        self,
        size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device,
    ) -> None:
        self.size = size
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (size + 1, num_kv_heads, head_dim)
        self.k_buffers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffers[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffers[layer_id]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffers[layer_id], self.v_buffers[layer_id]

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor
    ) -> None:
        """Store K and V ([n, num_kv_heads, head_dim], any float dtype) at slots `loc` ([n])."""
        if cache_k.dtype != self.dtype:
            cache_k = cache_k.to(self.dtype)
        if cache_v.dtype != self.dtype:
            cache_v = cache_v.to(self.dtype)
        self.k_buffers[layer_id][loc] = cache_k
        self.v_buffers[layer_id][loc] = cache_v

    @staticmethod
    def bytes_per_token(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """Device bytes one KV slot costs across all layers (K and V): sizes --max-total-tokens."""
        return 2 * num_layers * num_kv_heads * head_dim * dtype.itemsize
