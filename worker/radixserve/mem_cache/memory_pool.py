"""The two device-side pools: request rows of KV slot indices, and the K/V tensors themselves.

`ReqToTokenPool` maps (running request, token position) -> KV slot; attention kernels read it on
the device. `TokenToKVPool` holds the per-layer K and V values addressed by those slots.
"""

from __future__ import annotations

import torch


class ReqToTokenPool:
    """[size, max_context_len] int32 on the device: row = running request, entry = KV slot of
    that token.

    Two copies with two owners. The host mirror is the scheduler's: `ScheduleBatch` and the
    prefix cache write it through `write_batch`/`write_columns` and read it without a device
    sync. The device table is written only when the model runner prepares a pass
    (model_executor/forward_inputs.py): it takes the writes queued here since the last pass
    (`take_device_writes`), and a decode pass stores its one new cell per row from its own
    packed inputs, which is why a decode step's writes are not queued. On a CPU device the
    mirror *is* the table and nothing is queued.
    """

    def __init__(
        self,
        size: int,
        max_context_len: int,
        device: str | torch.device,
        separate_mirror: bool | None = None,
    ) -> None:
        """`separate_mirror` (default: off the CPU) keeps a host mirror apart from the table;
        tests turn it on for a CPU pool to stand in for a device one."""
        self.size = size
        self.max_context_len = max_context_len
        self.device = torch.device(device)
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32, device=device)
        if separate_mirror is None:
            separate_mirror = self.device.type != "cpu"
        self.mirror_is_table = not separate_mirror
        self._cpu_mirror = (
            self.req_to_token
            if self.mirror_is_table
            else torch.zeros((size, max_context_len), dtype=torch.int32)
        )
        # [3, n] int32 (rows, columns, values) per write, in write order, for the device table
        self._device_writes: list[torch.Tensor] = []
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
        """Write several rows' runs of slots; the device gets them as one queued write.

        The flat (row, column) index is built on the CPU, so a batch of N requests costs the
        next pass one host-to-device copy and one kernel instead of N of each.
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
        self._write(rows, cols, values, queue=True)

    def write_columns(
        self,
        req_indices: list[int],
        cols: list[int],
        values: torch.Tensor,
        stored_by_pass: bool = False,
    ) -> None:
        """One slot per row (a decode step): row req_indices[i] gets values[i] at cols[i].

        `stored_by_pass`: a decode pass stores these cells on the device itself, from the
        inputs it copies there anyway, so they are not queued (no copy, no index_put)."""
        if not req_indices:
            return
        rows = torch.tensor(req_indices, dtype=torch.int64)
        col_ids = torch.tensor(cols, dtype=torch.int64)
        self._write(rows, col_ids, values.to(device="cpu", dtype=torch.int32), not stored_by_pass)

    def _write(
        self, rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, queue: bool
    ) -> None:
        self._cpu_mirror[rows, cols] = values
        if queue and not self.mirror_is_table:
            self._device_writes.append(
                torch.stack([rows.to(torch.int32), cols.to(torch.int32), values])
            )

    def take_device_writes(self) -> list[torch.Tensor]:
        """The queued writes ([3, n] int32 each, oldest first) the device table still lacks;
        the caller applies them in order (a later write to a cell wins)."""
        writes, self._device_writes = self._device_writes, []
        return writes

    def read(self, req_idx: int, end: int) -> torch.Tensor:
        """row[req_idx][:end] as a fresh CPU int64 tensor, read from the mirror (no device sync)."""
        return self._cpu_mirror[req_idx, :end].to(torch.int64)

    def clear(self) -> None:
        """Free every row (server start, /flush_cache)."""
        self._free_rows = list(range(self.size))


def quantize_fp8(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """x / scale as `dtype` (a float8 type): saturated to its range, never inf or nan. Times
    the reciprocal, as the fused rotary-and-store kernel does, so both paths round alike."""
    largest = torch.finfo(dtype).max
    return (x.float() * (1.0 / scale)).clamp(-largest, largest).to(dtype)


class TokenToKVPool:
    """Per-layer K and V buffers [size + 1, num_kv_heads, head_dim]; slot 0 is the padding target.

    `dtype` is the storage type: the model's dtype, or float8_e4m3fn (`--kv-cache-dtype
    fp8_e4m3`), which halves a token's bytes and so doubles the tokens a budget holds. FP8
    buffers hold value / scale with one scale per layer for K and one for V (1.0 unless the
    checkpoint brings calibrated ones); readers multiply back (`read_kv`, or the kernels fold
    the scales into theirs)."""

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
        self._scales = [(1.0, 1.0)] * num_layers

    @property
    def is_fp8(self) -> bool:
        return self.dtype.itemsize == 1

    def scales(self, layer_id: int) -> tuple[float, float]:
        """(k_scale, v_scale) of a layer: stored value x scale = the real value."""
        return self._scales[layer_id]

    def set_scales(self, layer_id: int, k_scale: float, v_scale: float) -> None:
        if k_scale <= 0 or v_scale <= 0:
            raise ValueError(
                f"layer {layer_id}: KV scales must be positive, got {k_scale}, {v_scale}"
            )
        self._scales[layer_id] = (float(k_scale), float(v_scale))

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
        if self.is_fp8:
            k_scale, v_scale = self._scales[layer_id]
            cache_k = quantize_fp8(cache_k, k_scale, self.dtype)
            cache_v = quantize_fp8(cache_v, v_scale, self.dtype)
        if cache_k.dtype != self.dtype:
            cache_k = cache_k.to(self.dtype)
        if cache_v.dtype != self.dtype:
            cache_v = cache_v.to(self.dtype)
        self.k_buffers[layer_id][loc] = cache_k
        self.v_buffers[layer_id][loc] = cache_v

    def read_kv(
        self, layer_id: int, index: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The real K and V values at slots `index` (any shape), as `dtype`."""
        k = self.k_buffers[layer_id][index]
        v = self.v_buffers[layer_id][index]
        if not self.is_fp8:
            return k.to(dtype), v.to(dtype)
        k_scale, v_scale = self._scales[layer_id]
        return (k.float() * k_scale).to(dtype), (v.float() * v_scale).to(dtype)

    @staticmethod
    def bytes_per_token(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """Device bytes one KV slot costs across all layers (K and V): sizes --max-total-tokens."""
        return 2 * num_layers * num_kv_heads * head_dim * dtype.itemsize
