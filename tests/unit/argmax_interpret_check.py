"""Run the two-stage argmax kernels in Triton's CPU interpreter against torch.argmax; print one
JSON result line. Started by test_argmax_interpret.py in a subprocess (TRITON_INTERPRET must be
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
from triton_interpret_check import _allow_one_element_index  # noqa: E402

from radixserve.kernels import argmax as argmax_module  # noqa: E402
from radixserve.kernels import triton_support  # noqa: E402

_allow_one_element_index()
gen = torch.Generator().manual_seed(0)
CHUNK = argmax_module._CHUNK


def rows_of(vocab: int) -> torch.Tensor:
    """Random rows plus the hard ones: ties inside a chunk and across chunks (the first must
    win), the maximum in the ragged last chunk, a row of -inf, a row of +inf and -inf."""
    rows = torch.randn(3, vocab, generator=gen)
    tie_in_chunk = torch.zeros(vocab)
    tie_in_chunk[[5, 9]] = 3.0
    tie_across = torch.zeros(vocab)
    tie_across[[min(CHUNK + 7, vocab - 3), vocab - 1, 1]] = 2.0
    last = torch.randn(vocab, generator=gen)
    last[vocab - 1] = 100.0
    neg_inf = torch.full((vocab,), float("-inf"))
    infs = torch.full((vocab,), float("-inf"))
    infs[[vocab // 2, vocab - 2]] = float("inf")
    return torch.cat([rows, torch.stack([tie_in_chunk, tie_across, last, neg_inf, infs])])


cases = []
with mock.patch.object(triton_support, "enabled_for", lambda x: True):
    for vocab in (CHUNK * 3 + 5, 1000, CHUNK):
        for dtype in (torch.float32, torch.float16):
            logits = rows_of(vocab).to(dtype)
            ours = argmax_module.argmax(logits)
            cases.append(
                {
                    "vocab": vocab,
                    "dtype": str(dtype),
                    "ours": ours.tolist(),
                    "torch": torch.argmax(logits, dim=-1).tolist(),
                }
            )
    wide = rows_of(CHUNK * 3 + 5)
    strided = torch.cat([wide, wide], dim=-1)[:, : wide.shape[1]]  # rows not contiguous
    cases.append(
        {
            "vocab": "strided",
            "dtype": "torch.float32",
            "ours": argmax_module.argmax(strided).tolist(),
            "torch": torch.argmax(wide, dim=-1).tolist(),
        }
    )
    empty = argmax_module.argmax(torch.empty(0, 50))
    # the winners also land in a table at each row's index (a padded row's at the spare slot 0)
    table = torch.full((12,), -1, dtype=torch.int64)
    logits = rows_of(1000)
    index = torch.tensor([7, 3, 9, 0, 0, 0, 0, 0])
    returned = argmax_module.argmax(logits, scatter_to=(table, index))
    scatter = {"table": table.tolist(), "returned": returned.tolist()}
print(json.dumps({"cases": cases, "empty_shape": list(empty.shape), "scatter": scatter}))
