"""The two-stage argmax (kernels/argmax.py), run on the CPU by Triton's interpreter: exactly
torch.argmax, ties and infinities included; off CUDA `argmax` is torch.argmax itself."""

from __future__ import annotations

import pytest
import torch
from interpreter_harness import run_interpreted

from radixserve.kernels.argmax import _CHUNK, argmax


def test_kernels_give_torch_argmax():
    pytest.importorskip("triton")
    result = run_interpreted("argmax_interpret_check.py")
    assert len(result["cases"]) == 7
    for case in result["cases"]:
        assert case["ours"] == case["torch"], case
    # the hard rows are what they claim (first case: vocab 3 chunks + 5): ties go to the first
    # index, inside a chunk and across chunks; the maximum in the ragged last chunk; -inf rows
    hard = result["cases"][0]["torch"][3:]
    assert hard == [5, 1, 3 * _CHUNK + 4, 0, (3 * _CHUNK + 5) // 2]
    assert result["empty_shape"] == [0]
    scatter = result["scatter"]
    table, returned = scatter["table"], scatter["returned"]
    assert [table[7], table[3], table[9]] == returned[:3]
    assert table[0] in returned[3:]  # the rows sharing slot 0: one of them
    assert [table[i] for i in (1, 2, 4, 5, 6, 8, 10, 11)] == [-1] * 8  # nothing else written


def test_off_cuda_it_is_torch_argmax():
    logits = torch.randn(4, 300)
    expected = torch.argmax(logits, dim=-1)
    assert torch.equal(argmax(logits), expected)
    table = torch.zeros(10, dtype=torch.int64)
    assert torch.equal(argmax(logits, scatter_to=(table, torch.tensor([2, 5, 6, 9]))), expected)
    assert table[[2, 5, 6, 9]].tolist() == expected.tolist() and table[[0, 1, 3]].eq(0).all()
