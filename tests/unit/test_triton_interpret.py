"""The Triton attention kernels, run on the CPU by Triton's interpreter (no GPU needed).

Checks decode (split-KV with GQA), extend with cached prefixes, mixed batches, sliding
windows, logit soft-caps, attention sinks, FP8 KV and the page-table gather against a float64 dense reference. The kernels themselves are the same
source the GPU compiles; tests/gpu repeats this at full size and in bf16.
"""

from __future__ import annotations

import pytest
from interpreter_harness import run_interpreted

pytest.importorskip("triton")

TOLERANCE = {"torch.float32": 1e-5, "torch.float16": 2e-3}


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted("triton_interpret_check.py")


def test_attention_kernels_match_dense_reference(interpreted) -> None:
    results = interpreted["attention"]
    assert len(results) == 8
    for result in results:
        assert result["rel_err"] < TOLERANCE[result["dtype"]], result
        assert result["stored_kv"], result


def test_windows_soft_caps_and_fp8_kv_match_dense_reference(interpreted) -> None:
    """Sliding windows, logit soft-caps, attention sinks and an FP8 pool (values on the FP8
    grid, so storing is exact) in the Triton kernels and the torch_native reference backend
    alike."""
    results = interpreted["variants"]
    assert len(results) == 9
    for result in results:
        assert result["rel_err"] < TOLERANCE["torch.float32"], result
        assert result["native_rel_err"] < TOLERANCE["torch.float32"], result
        assert result["stored_kv"], result


def test_decode_over_more_splits_than_the_short_merge_tile(interpreted) -> None:
    """A long context at a GPU's split count: each split spans one KV tile, and its 24 filled
    splits are more than the merge's short tile holds, so the merge takes the tall one."""
    result = interpreted["long_decode"]
    assert result["splits"] == 64
    assert result["rel_err"] < TOLERANCE["torch.float32"], result


def test_kv_indices_gather_follows_req_to_token(interpreted) -> None:
    assert interpreted["kv_indices_ok"]
