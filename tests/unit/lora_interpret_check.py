"""Run the LoRA shrink/expand kernels in Triton's CPU interpreter against a float64 reference
of each token's own adapter, and against the torch path; print one JSON result line. Started by
test_lora_interpret.py in a subprocess (TRITON_INTERPRET must be set before the kernel module is
imported)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from unittest import mock

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from triton_interpret_check import _allow_one_element_index  # noqa: E402

from radixserve.kernels import lora as lora_kernels  # noqa: E402
from radixserve.kernels import triton_support  # noqa: E402
from radixserve.layers.lora_linear import LoRABatch, LoRALinear  # noqa: E402

_allow_one_element_index()
gen = torch.Generator().manual_seed(0)


def segments(lens: list[int], slots: list[int]):
    starts = torch.zeros(len(lens) + 1, dtype=torch.int32)
    starts[1:] = torch.cumsum(torch.tensor(lens), 0)
    seg_slots = torch.tensor(slots, dtype=torch.int32)
    return starts, seg_slots, torch.repeat_interleave(seg_slots, torch.tensor(lens))


def reference(x, a, b, token_slots):
    """float64, one token at a time: x · A[slot]ᵀ · B[slot]ᵀ, zero for slot -1."""
    out = torch.zeros(x.shape[0], b.shape[1], dtype=torch.float64)
    for t, slot in enumerate(token_slots.tolist()):
        if slot >= 0:
            out[t] = (x[t].double() @ a[slot].double().t()) @ b[slot].double().t()
    return out


def rel(x, y) -> float:
    return float((x.double() - y).norm() / y.norm().clamp(min=1e-12))


# (segment lengths, their slots, K, N, rank): a prefill mix with the base in the middle and a
# segment longer than a block, decode rows (one token each, by slot) with padding rows, a
# rank below 16, more decode rows than one program takes
CASES = [
    ([20, 3, 17], [1, -1, 0], 96, 80, 16),
    ([1, 1, 1, 1, 1, 1], [2, 0, -1, 2, 1, -1], 64, 48, 8),
    ([5], [-1], 32, 40, 16),
    ([1] * 70, [(i * 7) % 4 - 1 for i in range(70)], 32, 40, 8),  # two blocks of decode rows
]
results = []
with torch.no_grad(), mock.patch.object(triton_support, "enabled_for", lambda x: True):
    for lens, slots, k, n, rank in CASES:
        for dtype in (torch.float32, torch.float16):
            starts, seg_slots, token_slots = segments(lens, slots)
            tokens = sum(lens)
            x = torch.randn(tokens, k, generator=gen).to(dtype)
            a = (torch.randn(3, rank, k, generator=gen) * 0.1).to(dtype)
            b = (torch.randn(3, n, rank, generator=gen) * 0.1).to(dtype)
            base = torch.randn(tokens, n, generator=gen).to(dtype)
            s = lora_kernels.shrink(x, a, starts, seg_slots, max(lens))
            y = base.clone()
            lora_kernels.expand(y, s, b, starts, seg_slots, max(lens))
            s_torch = lora_kernels.shrink_torch(x, a, token_slots)
            y_torch = base.clone()
            lora_kernels.expand_torch(y_torch, s_torch, b, token_slots)
            want = base.double() + reference(x, a, b, token_slots)
            base_rows = token_slots < 0
            results.append(
                {
                    "case": f"{lens}-{slots}-{dtype}",
                    "dtype": str(dtype),
                    "rel_err": rel(y, want),
                    "torch_rel_err": rel(y_torch, want),
                    "base_rows_untouched": bool(torch.equal(y[base_rows], base[base_rows])),
                }
            )
    # the wrapper over a fused q/k/v-like projection: column slices of y, B and the shrink
    # output go to the kernels as strided views; the same wrapper through the torch path
    batch = LoRABatch(torch.device("cpu"), 8)
    base = torch.nn.Linear(48, 24 + 8 + 8, bias=False)
    layer = LoRALinear(base, 48, [24, 8, 8], 3, 16, batch, torch.float32)
    layer.lora_a.copy_(torch.randn(layer.lora_a.shape, generator=gen) * 0.1)
    layer.lora_b.copy_(torch.randn(layer.lora_b.shape, generator=gen) * 0.1)
    batch.prepare([0, -1, 2, 1], [7, 2, 1, 18])
    x = torch.randn(28, 48, generator=gen)
    fused = layer(x)
with torch.no_grad():
    unfused = layer(x)
print(json.dumps({"cases": results, "wrapper_rel_err": rel(fused, unfused.double())}))
