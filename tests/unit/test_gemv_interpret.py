"""The batch-1 GEMV kernel, run on the CPU by Triton's interpreter, against a float64
reference; and `linear`'s dispatch, which must leave every other case to F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from interpreter_harness import run_interpreted

from radixserve.layers.gemv import Linear, linear

TOLERANCE = {"torch.float32": 1e-6, "torch.float16": 1e-3}


@pytest.fixture(scope="module")
def interpreted() -> dict:
    pytest.importorskip("triton")
    return run_interpreted("gemv_interpret_check.py")


def test_gemv_matches_float64_reference(interpreted):
    cases = interpreted["plain"]
    assert len(cases) == 16
    for case in cases:
        n = case["shape"][0]
        assert case["out_shape"] == [1, n] and case["out_dtype"] == case["dtype"], case
        assert case["rel_err"] < TOLERANCE[case["dtype"]], case


def test_gemv_prologues_match_the_ops_they_replace(interpreted):
    """RMSNorm (± residual add) and SiLU-and-mul computed inside the GEMV give the product of
    what the standalone ops produce, and the residual sum comes out exactly as the add's."""
    cases = interpreted["prologue"]
    assert {c["kind"] for c in cases} == {"norm", "add_norm", "silu_mul"} and len(cases) == 12
    for case in cases:
        assert case["out_shape"] == [1, case["shape"][0]], case
        # the input is rounded where the standalone op stores it, so the gap is the GEMV's own
        # rounding plus at most one ulp of an input element
        assert case["rel_err"] < 4 * TOLERANCE[case["dtype"]], case
        if case["kind"] == "add_norm":
            assert case["residual_exact"], case


def test_linear_off_cuda_is_exactly_f_linear():
    torch.manual_seed(0)
    w, b = torch.randn(24, 16), torch.randn(24)
    for x in (torch.randn(1, 16), torch.randn(5, 16)):
        assert torch.equal(linear(x, w, b), F.linear(x, w, b))
    layer = Linear(16, 24)
    x = torch.randn(1, 16)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert set(dict(layer.named_parameters())) == {"weight", "bias"}  # checkpoint names


def test_folded_prologues_off_cuda_are_the_plain_ops():
    """Off CUDA (and for batches) `after_norm` / `after_silu_and_mul` are the norm or
    activation module followed by the projection: the reference path, bit for bit."""
    from radixserve.layers.activation import SiluAndMul
    from radixserve.layers.layernorm import RMSNorm

    torch.manual_seed(1)
    layer, norm = Linear(16, 24), RMSNorm(16, eps=1e-5)
    norm.weight.data = 1 + 0.1 * torch.randn(16)
    for rows in (1, 3):
        x, r = torch.randn(rows, 16), torch.randn(rows, 16)
        y, summed = layer.after_norm(norm, x.clone(), r.clone())
        ref_in, ref_sum = norm.forward_native(x, r)
        assert torch.equal(summed, ref_sum) and torch.equal(y, layer(ref_in))
        y, same = layer.after_norm(norm, x, None)
        assert same is x and torch.equal(y, layer(norm.forward_native(x)))
        gate_up = torch.randn(rows, 32)
        down = Linear(16, 24)
        assert torch.equal(
            down.after_silu_and_mul(gate_up, SiluAndMul()), down(SiluAndMul()(gate_up))
        )
