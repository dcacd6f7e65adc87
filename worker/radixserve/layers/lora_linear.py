"""`LoRALinear`: a projection plus the LoRA products of whichever adapter each token's request
uses, and `LoRABatch`, the pass's adapter layout every wrapped projection reads.

The wrapper takes the base projection's parameters as its own (same names, same tensors), so the
checkpoint loads through it unchanged, whatever the base is (plain, FP8). The adapters' weights
live in slot-stacked buffers that the LoRA pool (lora/pool.py) writes; which slot each token
uses is a step input (`LoRABatch`), written into fixed device buffers before every pass, so a
captured CUDA graph reads each replay's own layout.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from radixserve.kernels import lora as lora_kernels
from radixserve.kernels import triton_support
from radixserve.kernels.gemv import LoRAEpilogue, block_config, gemv, uses_gemv
from radixserve.layers.activation import silu_and_mul
from radixserve.layers.layernorm import RMSNorm

NO_ADAPTER = -1  # a base-model row's slot


class LoRABatch:
    """The pass's tokens cut into segments of one adapter slot: a request's extend tokens, or
    one decode row (graph padding rows use no adapter), and for a decode pass its rows grouped
    by slot (`kernels/lora.decode_blocks`). On CUDA the layout lives in one fixed device
    buffer, filled by one host-to-device copy a pass; on the CPU the torch path takes a slot
    per token instead."""

    def __init__(self, device: torch.device, max_rows: int, slots: int) -> None:
        self.device = device
        self.max_rows = max_rows
        self.slots = slots
        width = 1 + lora_kernels.DECODE_BLOCK_M
        self._blocks_at = 2 * max_rows + 1
        # [segment starts (max_rows + 1) | segment slots (max_rows) | decode blocks]
        self._packed = torch.zeros(
            self._blocks_at + lora_kernels.max_decode_blocks(max_rows, slots) * width,
            dtype=torch.int32,
            device=device,
        )
        self.layout = self._views(0, 0)
        # False when no row of the pass uses an adapter: the wrappers skip their products and
        # a replay takes the graph captured without them (True when capturing the graph with
        # them, whose replays may mix)
        self.active = False
        # where a captured decode pass's shrinks run, beside the base products
        # (`LoRALinear.forward`)
        self.shrink_stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def prepare(
        self, row_slots: Sequence[int], row_lens: Sequence[int], always: bool = False
    ) -> None:
        """This pass's layout: row i has `row_lens[i]` tokens and uses slot `row_slots[i]`
        (NO_ADAPTER for the base model). An inactive pass (no adapter row, not `always`)
        copies nothing: nothing reads the layout."""
        rows = len(row_slots)
        if rows > self.max_rows:
            raise ValueError(f"{rows} rows exceed the LoRA batch's {self.max_rows}")
        self.active = always or any(s != NO_ADAPTER for s in row_slots)
        max_seg_len = max(row_lens, default=0)
        self.layout = self._views(rows, max_seg_len)
        if not self.active:
            return
        host = torch.zeros(self._packed.shape[0], dtype=torch.int32)
        lens = torch.tensor(row_lens, dtype=torch.int32)
        slots = torch.tensor(row_slots, dtype=torch.int32)
        torch.cumsum(lens, 0, out=host[1 : rows + 1])
        host[self.max_rows + 1 : self.max_rows + 1 + rows] = slots
        if max_seg_len == 1:
            table = lora_kernels.decode_blocks(row_slots, self.slots)
            host[self._blocks_at : self._blocks_at + len(table)] = torch.tensor(table)
        if self.device.type == "cuda":
            self._packed.copy_(host.pin_memory(), non_blocking=True)
        else:
            self._packed.copy_(host)
        if self.device.type != "cuda" or triton_support.triton is None:  # the torch path's
            token_slots = torch.repeat_interleave(slots, lens).to(self.device)
            self.layout = self.layout._replace(token_slots=token_slots)

    def _views(self, rows: int, max_seg_len: int) -> lora_kernels.Layout:
        """The layout of a pass of `rows` rows: views of the fixed buffer (a captured graph
        holds their addresses), the decode block table as long as that row count needs."""
        width = 1 + lora_kernels.DECODE_BLOCK_M
        blocks = lora_kernels.max_decode_blocks(rows, self.slots) if max_seg_len == 1 else 0
        at = self._blocks_at
        return lora_kernels.Layout(
            seg_starts=self._packed[: rows + 1],
            seg_slots=self._packed[self.max_rows + 1 : self.max_rows + 1 + rows],
            max_seg_len=max_seg_len,
            blocks=self._packed[at : at + blocks * width].view(blocks, width),
        )


class LoRALinear(nn.Module):
    """`base(x)` plus, for each token, `x · Aᵀ · Bᵀ` of its adapter (scaling folded into B).

    `sub_sizes` are the output widths of the projections fused in `base` (q, k, v or gate, up;
    one for o and down): each has its own A and B, padded to the pool's rank."""

    def __init__(
        self,
        base: nn.Module,
        in_features: int,
        sub_sizes: Sequence[int],
        slots: int,
        max_rank: int,
        batch: LoRABatch,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        # the base's parameters under their own names: a checkpoint loads as before
        object.__setattr__(self, "base", base)
        for name, param in base.named_parameters(recurse=False):
            self.register_parameter(name, param)
        for name, buffer in base.named_buffers(recurse=False):
            self.register_buffer(name, buffer)
        self.sub_sizes = list(sub_sizes)
        self.max_rank = max_rank
        self.batch = batch
        device = batch.device
        out = sum(self.sub_sizes)
        self.lora_a = torch.zeros(
            (slots, len(self.sub_sizes) * max_rank, in_features), dtype=dtype, device=device
        )
        self.lora_b = torch.zeros((slots, out, max_rank), dtype=dtype, device=device)
        # (the normed row, its s): the shrink that `norm_and_project` did with the norm before
        # this projection, taken by the next call on exactly that row
        self._shrunk_by_norm: tuple[torch.Tensor, torch.Tensor] | None = None

    def load_rows(self, kind: str, start: int, count: int, tensor: torch.Tensor) -> set[str]:
        return self.base.load_rows(kind, start, count, tensor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = self.batch
        if not batch.active:
            return self.base(x)
        # batch 1: the expand in the GEMV's epilogue, fused q/k/v too: with B read before the
        # GEMV's wait and s right after it, the epilogue adds 0-7 us a launch (q/k/v ~2, gate/up
        # ~7; kernels/gemv.py) and the expand's own launch is gone (H200 2026-12-04)
        if uses_gemv(x, self.base.weight):
            return self._gemv(x, self._shrink(x), gated=False)
        stream = batch.shrink_stream
        if (
            stream is not None
            and batch.layout.max_seg_len == 1
            and torch.cuda.is_current_stream_capturing()
        ):
            shrunk, y = self._shrink_beside_base(x, stream)
        else:  # eagerly a fork and a join would cost more host time than the overlap saves
            shrunk = self._shrink(x)
            y = self.base(x)
        lora_kernels.expand(y, shrunk, self.lora_b, batch.layout, self.sub_sizes)
        return y

    def _shrink_beside_base(
        self, x: torch.Tensor, stream: torch.cuda.Stream
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A captured decode pass's shrink on its own stream while the base product runs (a
        fork and a join, which the graph keeps as two branches): the shrink reads only x, and at a
        few dozen rows cuBLAS's product leaves SMs idle, where the shrink's 64-128 programs
        fit; in line, four a layer, they cost their launch and latency each time (at 64 rows
        over 8 adapters, q/k/v's 91 us and o's 70 us an 8B step, H200 2026-12-04).
        No `record_stream`: s, allocated on the side stream and read by the expand on this
        one, is freed after the expand is queued, and the side stream's next allocation
        follows its next fork, which waits for everything queued here before, that expand
        included. x, this stream's, is reused here only after the join."""
        main = torch.cuda.current_stream(x.device)
        stream.wait_stream(main)
        with torch.cuda.stream(stream):
            shrunk = self._shrink(x)
        y = self.base(x)
        main.wait_stream(stream)
        return shrunk, y

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of this [gate; up] projection of x, adapters included: at batch 1
        one gated GEMV with the adapter's expand in its epilogue, as the base alone takes."""
        batch = self.batch
        if not batch.active:
            return self.base.silu_and_mul(x)
        if uses_gemv(x, self.base.weight):
            return self._gemv(x, self._shrink(x), gated=True)
        return silu_and_mul(self.forward(x))

    def norm_and_project(
        self, norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The norm before this projection, as the decoder layer takes it ((norm(x + residual),
        x + residual); x as the residual without one), with this projection's shrink of its
        output in the same launch, where the shrink would be the one-row kernel: batch 1 with
        an adapter row. Saves the shrink's launch and its wait on the norm (two a layer: q/k/v
        and gate/up); the product takes the shrink's output on its next call. None elsewhere:
        the caller runs the norm itself."""
        batch = self.batch
        if not (
            batch.active and uses_gemv(x, self.base.weight) and batch.layout.seg_slots.shape[0] == 1
        ):
            return None
        normed, summed, s = norm.with_row_projection(
            x, residual, self.lora_a, torch.float32, slot=batch.layout.seg_slots[:1]
        )
        self._shrunk_by_norm = (normed, s.view(1, 1, -1))  # one row's whole s, as `shrink`'s
        return normed, summed

    def _shrink(self, x: torch.Tensor) -> torch.Tensor:
        """x times each token's adapter's A: `kernels/lora.shrink`'s partial sums, or the ones
        `norm_and_project` computed for exactly this x."""
        shrunk, self._shrunk_by_norm = self._shrunk_by_norm, None
        if shrunk is not None and shrunk[0] is x:
            return shrunk[1]
        return lora_kernels.shrink(x, self.lora_a, self.batch.layout)

    def _gemv(self, x: torch.Tensor, shrunk: torch.Tensor, gated: bool) -> torch.Tensor:
        """The base's batch-1 GEMV (plain or FP8, as its own forward would launch it) with the
        row's adapter term in the epilogue."""
        weight = self.base.weight
        fp8 = weight.dtype == torch.float8_e4m3fn
        return gemv(
            x,
            weight,
            self.base.bias,
            *block_config(*weight.shape, fp8=fp8),
            gated=gated,
            scale=self.base.weight_scale if fp8 else None,
            lora=LoRAEpilogue(
                shrunk,
                self.lora_b,
                self.batch.layout.seg_slots[:1],
                () if gated else tuple(self.sub_sizes),
            ),
        )
