"""DeepSeek's MoE block with its Triton kernels (Triton's CPU interpreter) against transformers'
block on the same weights: V2-Lite's, V2's and V3's routing, where a pass of a few tokens takes
the routed GEMV with the shared experts folded into its two launches (weight 1, beside routed
weights scaled by `routed_scaling_factor`), and where more tokens take the grouped GEMMs and
the shared MLP by itself; FP8 experts and shared projections against the block's torch path."""

from __future__ import annotations

import pytest
from interpreter_harness import run_interpreted


@pytest.fixture(scope="module")
def interpreted() -> list[dict]:
    pytest.importorskip("triton")
    return run_interpreted("deepseek_moe_interpret_check.py")


def test_moe_block_matches_transformers_with_shared_slots_folded(interpreted):
    cases = [case for case in interpreted if case["case"].endswith("float32")]
    assert len(cases) == 9
    assert sum(case["folded_expected"] for case in cases) == 6  # 1 and 2 tokens of each
    for case in cases:
        assert case["rel_err"] < 1e-5, case
        # folded: the shared MLP never ran by itself; otherwise it ran once, beside the experts
        assert case["shared_ran_by_itself"] == (0 if case["folded_expected"] else 1), case


def test_fp8_moe_block_folds_the_shared_experts(interpreted):
    cases = [case for case in interpreted if case["case"].endswith("fp8")]
    assert len(cases) == 3
    for case in cases:
        assert case["shared_ran_by_itself"] == 0, case
        assert case["rel_err"] < 3e-3, case
