"""Every decode tile lora_bench.py's sweep can pick (and the defaults) gives the reference's
result, in Triton's CPU interpreter: base rows, one adapter, every row a different adapter."""

from __future__ import annotations

import pytest
from interpreter_harness import run_interpreted

from radixserve.kernels import lora as lora_kernels

PATTERNS = ("base_rows", "one_adapter", "all_different")


@pytest.fixture(scope="module")
def results() -> dict:
    pytest.importorskip("triton")
    return run_interpreted("lora_tiles_check.py")


def check(result: dict) -> None:
    assert result["rel_err"] < 1e-5, result
    assert result["base_rows_untouched"], result


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("index", range(len(lora_kernels.SHRINK_SWEEP)))
def test_shrink_tile_matches_reference(results: dict, index: int, pattern: str) -> None:
    check(results[f"shrink{index}-{pattern}"])


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("index", range(len(lora_kernels.EXPAND_SWEEP)))
def test_expand_tile_matches_reference(results: dict, index: int, pattern: str) -> None:
    check(results[f"expand{index}-{pattern}"])


@pytest.mark.parametrize("pattern", PATTERNS)
def test_default_tiles_match_reference(results: dict, pattern: str) -> None:
    check(results[f"default-{pattern}"])


def test_splits_follow_the_tile(results: dict) -> None:
    """K 1100: a 512-wide split gives 3 partials, 1024 two, 2048 one; the 16-row default's
    split is 512 (at least two 256-wide chunks a split)."""
    splits = {
        results[f"shrink{i}-base_rows"]["splits"] for i in range(len(lora_kernels.SHRINK_SWEEP))
    }
    assert splits == {1, 2, 3}
    assert results["default-base_rows"]["splits"] == 3
