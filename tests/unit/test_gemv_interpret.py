"""The batch-1 GEMV kernel, run on the CPU by Triton's interpreter, against a float64
reference; and `linear`'s dispatch, which must leave every other case to F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from interpreter_harness import run_interpreted

from radixserve.layers.activation import silu_and_mul_native
from radixserve.layers.linear import Linear, linear, linear_silu_and_mul

TOLERANCE = {"torch.float32": 1e-6, "torch.float16": 1e-3}


def test_gemv_matches_float64_reference():
    pytest.importorskip("triton")
    result = run_interpreted("gemv_interpret_check.py")
    cases = result["cases"]
    assert len(cases) == 16
    for case in cases:
        n = case["shape"][0]
        assert case["out_shape"] == [1, n] and case["out_dtype"] == case["dtype"], case
        assert case["rel_err"] < TOLERANCE[case["dtype"]], case
    # float32 logits straight out of a half-precision product: its values, widened
    assert result["widened"] == [{"dtype": "torch.float32", "exact": True}] * 2
    # the gated product: silu(gate) * up with no activation kernel, the two-kernel values
    assert len(result["gated"]) == 6
    for case in result["gated"]:
        assert case["out_shape"] == [1, case["shape"][0] // 2], case
        assert case["same_as_two_kernels"], case
        assert case["rel_err"] < TOLERANCE["torch.float16"], case
    # FP8 rows times their scales: the dequantized product, to float16 rounding
    assert len(result["fp8"]) == 4
    for case in result["fp8"]:
        n, gated = case["shape"][0], case["shape"][4]
        assert case["out_shape"] == [1, n // 2 if gated else n], case
        assert case["rel_err"] < TOLERANCE["torch.float16"], case


def test_linear_off_cuda_is_exactly_f_linear():
    torch.manual_seed(0)
    w, b = torch.randn(24, 16), torch.randn(24)
    for x in (torch.randn(1, 16), torch.randn(5, 16)):
        assert torch.equal(linear(x, w, b), F.linear(x, w, b))
    layer = Linear(16, 24)
    x = torch.randn(1, 16)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    x16, w16 = x.half(), w.half()
    wide = linear(x16, w16, out_dtype=torch.float32)
    assert wide.dtype == torch.float32 and torch.equal(wide, F.linear(x16, w16).float())
    assert set(dict(layer.named_parameters())) == {"weight", "bias"}  # checkpoint names


def test_linear_silu_and_mul_off_cuda_is_the_torch_reference():
    torch.manual_seed(1)
    w, b, x = torch.randn(24, 16), torch.randn(24), torch.randn(1, 16)
    expected = silu_and_mul_native(F.linear(x, w, b))
    assert linear_silu_and_mul(x, w, b).shape == (1, 12)
    assert torch.equal(linear_silu_and_mul(x, w, b), expected)
