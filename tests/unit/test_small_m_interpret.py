"""The 2-16 row projection kernel (kernels/small_m.py), run on the CPU by Triton's
interpreter, against a float64 reference; and the dispatch around it, which must leave the
CPU (and every case the kernel does not take) to F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from interpreter_harness import run_interpreted

from radixserve.kernels import small_m
from radixserve.layers.activation import silu_and_mul_native
from radixserve.layers.linear import linear, linear_silu_and_mul

TOLERANCE = {"torch.float32": 1e-6, "torch.float16": 1e-3}


def test_small_m_matches_float64_reference():
    pytest.importorskip("triton")
    result = run_interpreted("small_m_interpret_check.py")
    cases = result["cases"]
    assert len(cases) == 40
    for case in cases:
        m, n = case["shape"][:2]
        assert case["out_shape"] == [m, n] and case["out_dtype"] == case["dtype"], case
        assert case["rel_err"] < TOLERANCE[case["dtype"]], case
        # rows 0..m-1 of a 16-row product, bit for bit: padding a batch changes no row
        assert case["rows_of_16"] in (True, None), case
    assert sum(case["rows_of_16"] is True for case in cases) == 16
    # float32 logits straight out of a half-precision product: its values, widened
    assert result["widened"] == [{"dtype": "torch.float32", "exact": True}] * 2
    # the gated product: silu(gate) * up in the epilogue, the two-kernel values
    assert len(result["gated"]) == 9
    for case in result["gated"]:
        m, n = case["shape"][:2]
        assert case["out_shape"] == [m, n // 2], case
        assert case["same_as_two_kernels"], case
        assert case["rel_err"] < TOLERANCE["torch.float16"], case
    # FP8 rows times their scales: the dequantized product, to float16 rounding
    assert len(result["fp8"]) == 8
    for case in result["fp8"]:
        m, n, _, gated = case["shape"]
        assert case["out_shape"] == [m, n // 2 if gated else n], case
        assert case["rel_err"] < TOLERANCE["torch.float16"], case


def test_off_cuda_every_row_count_is_exactly_f_linear():
    torch.manual_seed(0)
    w, b = torch.randn(48, 32).half(), torch.randn(48).half()
    for rows in (2, 5, 16, 17):
        x = torch.randn(rows, 32).half()
        assert not small_m.uses_small_m(x, w)
        assert torch.equal(linear(x, w, b), F.linear(x, w, b))
        gated = linear_silu_and_mul(x, w, b)
        assert torch.equal(gated, silu_and_mul_native(F.linear(x, w, b)))


def test_small_m_takes_what_the_gemv_streams_at_2_to_16_rows(monkeypatch):
    """With the kernels on (a CUDA tensor's case), 2-16 half-precision rows over a weight of
    their dtype or FP8 with unit-stride rows; one row is the GEMV's, float32 and 17 rows
    cuBLAS's."""
    monkeypatch.setattr("radixserve.kernels.triton_support.enabled_for", lambda x: True)
    w = torch.randn(64, 32).half()
    for rows, expected in [(1, False), (2, True), (8, True), (16, True), (17, False)]:
        assert small_m.uses_small_m(torch.randn(rows, 32).half(), w) == expected, rows
    x = torch.randn(8, 32).half()
    assert small_m.uses_small_m(x, w.to(torch.float8_e4m3fn))
    assert not small_m.uses_small_m(x, w.float())  # another dtype
    assert not small_m.uses_small_m(x.float(), w.float())  # float32: the exactness reference
    assert not small_m.uses_small_m(x, torch.randn(32, 64).half().t())  # strided rows
    assert not small_m.uses_small_m(x[None], w)  # 3-D


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (14336, 4096), (4096, 14336)])
def test_every_8b_projection_has_about_two_programs_an_sm(n, k, fp8):
    """Without split-K, what streams the whole H200 (132 SMs) is enough programs (n is the
    output width: gate/up's half): 4096 columns make 256 programs, 1.94 an SM; and no program
    is narrower than the dot's 16 rows."""
    rows, chunk, _, _ = small_m.block_config(n, k, fp8)
    assert rows >= 16 and chunk <= k
    assert -(-n // rows) >= 1.9 * 132
