"""The Triton MLA decode kernel (kernels/mla_decode.py), run on the CPU by Triton's
interpreter: absorbed queries against latent rows scattered over the pool through
req_to_token, several requests and a head count off the kernel's head block, and one long
request split 128 ways, against a float64 dense computation (and the torch reference the CPU
serves with). tests/gpu repeats it at DeepSeek's sizes in bf16."""

from __future__ import annotations

import pytest
from interpreter_harness import run_interpreted

pytest.importorskip("triton")


def test_mla_decode_kernel_matches_dense_reference() -> None:
    results = run_interpreted("mla_interpret_check.py")
    assert len(results) == 2
    assert results[1]["splits"] == 128
    for result in results:
        assert result["rel_err"] < 1e-5, result
        assert result["native_rel_err"] < 1e-5, result
