"""The skinny GEMM (2-16 rows), run on the CPU by Triton's interpreter, against a float64
reference; and `linear`'s dispatch, which leaves every case off CUDA to F.linear."""

from __future__ import annotations

import pytest
import torch
from interpreter_harness import run_interpreted

from radixserve.kernels.skinny_gemm import MAX_ROWS, uses_skinny

FLOAT16_TOLERANCE = 1e-3


def test_skinny_gemm_matches_float64_reference():
    pytest.importorskip("triton")
    result = run_interpreted("skinny_interpret_check.py")
    assert len(result["plain"]) == 10
    for case in result["plain"]:
        m, n, _ = case["shape"]
        assert case["out_shape"] == [m, n] and case["out_dtype"] == "torch.float16", case
        assert case["rel_err"] < FLOAT16_TOLERANCE, case
        assert case["rows_independent"], case
    assert result["strided"] and result["widened"]
    assert len(result["gated"]) == 4
    for case in result["gated"]:
        m, n, _ = case["shape"]
        assert case["out_shape"] == [m, n // 2], case
        assert case["same_as_two_kernels"], case
        assert case["rel_err"] < FLOAT16_TOLERANCE, case


def test_skinny_gemm_takes_only_few_half_precision_rows_on_cuda(monkeypatch):
    from radixserve.kernels import triton_support

    w = torch.randn(64, 32, dtype=torch.bfloat16)
    rows = lambda m, dtype=torch.bfloat16: torch.randn(m, 32, dtype=dtype)  # noqa: E731
    assert not uses_skinny(rows(4), w)  # off CUDA: F.linear
    monkeypatch.setattr(triton_support, "enabled_for", lambda x: True)
    assert [m for m in range(1, MAX_ROWS + 3) if uses_skinny(rows(m), w)] == list(
        range(2, MAX_ROWS + 1)
    )
    assert not uses_skinny(rows(4, torch.float32), w.float())  # the exactness reference
    assert not uses_skinny(rows(4), w.to(torch.float8_e4m3fn))  # FP8 keeps its own path
    assert not uses_skinny(rows(4), w.t().contiguous().t())  # weight rows not unit-stride
