"""Run the LoRA decode kernels in Triton's CPU interpreter with every tile of the bench's sweep
(`SHRINK_SWEEP`, `EXPAND_SWEEP`) and the defaults, against a float64 reference; print one JSON
result line. Started by test_lora_tiles_interpret.py in a subprocess (TRITON_INTERPRET must be
set before the kernel module is imported)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from unittest import mock

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from lora_reference import reference, rel, segments  # noqa: E402
from triton_interpret_check import _allow_one_element_index  # noqa: E402

from radixserve.kernels import lora as lora_kernels  # noqa: E402
from radixserve.kernels import triton_support  # noqa: E402

_allow_one_element_index()
gen = torch.Generator().manual_seed(1)

# decode rows (one token each, grouped into 16-row blocks by slot): random slots with base rows
# (-1) over several blocks, every row one adapter (two blocks, the second partial), every row a
# different adapter. K 1100: 1-3 splits whatever the candidate (the last one short); three fused
# sub-projections whose boundaries fall inside 64-, 128- and 256-column tiles; rank 8 below the
# dot's 16 lanes for one pattern
K = 1100
SIZES = [150, 70, 80]
PATTERNS = {
    "base_rows": ([(i * 5) % 4 - 1 for i in range(21)], 8, 3),
    "one_adapter": ([2] * 19, 16, 3),
    "all_different": ([5, 0, 3, 1, 4, 2], 16, 6),
}


def case(row_slots: list[int], rank: int, n_slots: int, shrink_tile, expand_tile) -> dict:
    layout = segments([1] * len(row_slots), row_slots, n_slots)
    n = sum(SIZES)
    x = torch.randn(len(row_slots), K, generator=gen)
    a = torch.randn(n_slots, len(SIZES) * rank, K, generator=gen) * 0.1
    b = torch.randn(n_slots, n, rank, generator=gen) * 0.1
    base = torch.randn(len(row_slots), n, generator=gen)
    y = base.clone()
    s = lora_kernels.shrink(x, a, layout, shrink_tile)
    lora_kernels.expand(y, s, b, layout, SIZES, expand_tile)
    want = base.double() + reference(x, a, b, layout.token_slots, SIZES, rank)
    base_rows = layout.token_slots < 0
    return {
        "rel_err": rel(y, want),
        "base_rows_untouched": bool(torch.equal(y[base_rows], base[base_rows])),
        "splits": s.shape[0],
    }


results: dict[str, dict] = {}
with torch.no_grad(), mock.patch.object(triton_support, "enabled_for", lambda x: True):
    for name, (row_slots, rank, n_slots) in PATTERNS.items():
        for i, tile in enumerate(lora_kernels.SHRINK_SWEEP):
            results[f"shrink{i}-{name}"] = case(row_slots, rank, n_slots, tile, None)
        for i, tile in enumerate(lora_kernels.EXPAND_SWEEP):
            results[f"expand{i}-{name}"] = case(row_slots, rank, n_slots, None, tile)
        results[f"default-{name}"] = case(row_slots, rank, n_slots, None, None)
print(json.dumps(results))
