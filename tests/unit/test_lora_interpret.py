"""The LoRA shrink/expand kernels (segmented by adapter), run on the CPU by Triton's
interpreter, against a float64 per-token reference; the torch path against the same."""

from __future__ import annotations

import pytest
from interpreter_harness import run_interpreted

TOLERANCE = {"torch.float32": 1e-5, "torch.float16": 3e-3}


def test_lora_kernels_match_float64_reference():
    pytest.importorskip("triton")
    result = run_interpreted("lora_interpret_check.py")
    cases = result["cases"]
    assert len(cases) == 26
    for case in cases:
        assert case["rel_err"] < TOLERANCE[case["dtype"]], case
        assert case["torch_rel_err"] < TOLERANCE[case["dtype"]], case
        assert case["base_rows_untouched"], case
    # a 5-row decode pass with K = 2100 splits it in five (512 a split, shrink_config for 16-row
    # blocks); a prefill does not split
    assert [c["splits"] for c in cases if c["case"].startswith("[1, 1, 1, 1, 1]-")] == [5, 5]
    assert all(c["splits"] == 1 for c in cases if c["case"].startswith("[17, 4]"))
    # one row: each rank column over the whole of K in one program, no partials
    assert [c["splits"] for c in cases if c["case"].startswith("[1]-")] == [1] * 6
    # LoRALinear's strided views of a fused projection: the kernels agree with the torch path
    assert result["wrapper_rel_err"] < 1e-6
    # batch 1: the GEMV's epilogue (fused q/k/v, one projection, gated) gives the torch path's
    # values, each slot and the base
    epilogue = result["epilogue"]
    assert len(epilogue) == 9
    for case in epilogue:
        assert case["rel_err"] < 3e-3, case
    # batch 1: the norm before the projection and its shrink in one launch (norm_and_shrink):
    # taken in the kernels' path only, the projection's output, the normed row and the residual
    # sum as the torch path's, Llama's and Gemma's norm, with and without a residual, an adapter
    # and a base row; a different row than the norm's output shrinks itself
    norm_shrink = result["norm_shrink"]
    assert len(norm_shrink) == 8
    for case in norm_shrink:
        assert case["took_the_fused_norm"] and case["torch_path_did_not"], case
        assert case["rel_err"] < 3e-3 and case["normed_rel_err"] < 1e-3, case
        assert case["residual_same"], case
        assert case["other_row_rel_err"] == 0.0, case
