"""The two-stage argmax (layers/argmax.py), run on the CPU by Triton's interpreter: exactly
torch.argmax, ties and infinities included; off CUDA `argmax` is torch.argmax itself."""

from __future__ import annotations

import pytest
import torch
from interpreter_harness import run_interpreted

from radixserve.layers.argmax import _CHUNK, argmax


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


def test_off_cuda_it_is_torch_argmax():
    logits = torch.randn(4, 300)
    assert torch.equal(argmax(logits), torch.argmax(logits, dim=-1))
