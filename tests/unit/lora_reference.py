"""The LoRA kernels' interpreter checks' shared pieces: a decode or prefill layout as
LoRABatch writes it, and a float64 per-token reference (imported by lora_interpret_check.py and
lora_tiles_check.py, which run under the interpreter)."""

from __future__ import annotations

import torch

from radixserve.kernels import lora as lora_kernels


def segments(lens: list[int], slots: list[int], n_slots: int) -> lora_kernels.Layout:
    """The kernels' layout of segments `lens` using `slots`, as LoRABatch writes it: a decode
    pass (one-row segments) with its rows grouped by slot."""
    starts = torch.zeros(len(lens) + 1, dtype=torch.int32)
    starts[1:] = torch.cumsum(torch.tensor(lens), 0)
    seg_slots = torch.tensor(slots, dtype=torch.int32)
    width = 1 + lora_kernels.DECODE_BLOCK_M
    blocks = torch.zeros(0, width, dtype=torch.int32)
    if max(lens) == 1:
        blocks = torch.tensor(lora_kernels.decode_blocks(slots, n_slots), dtype=torch.int32)
        blocks = blocks.view(-1, width)
    token_slots = torch.repeat_interleave(seg_slots, torch.tensor(lens))
    return lora_kernels.Layout(starts, seg_slots, max(lens), blocks, token_slots)


def reference(x, a, b, token_slots, sizes, rank):
    """float64, one token at a time and one sub-projection at a time: x · A_i[slot]ᵀ ·
    B_i[slot]ᵀ, zero for slot -1."""
    out = torch.zeros(x.shape[0], b.shape[1], dtype=torch.float64)
    for t, slot in enumerate(token_slots.tolist()):
        if slot < 0:
            continue
        offset = 0
        for i, size in enumerate(sizes):
            a_i = a[slot, i * rank : (i + 1) * rank].double()
            b_i = b[slot, offset : offset + size].double()
            out[t, offset : offset + size] = (x[t].double() @ a_i.t()) @ b_i.t()
            offset += size
    return out


def rel(x, y) -> float:
    return float((x.double() - y).norm() / y.norm().clamp(min=1e-12))
