"""The Triton MLA decode kernel (kernels/mla_decode.py), run on the CPU by Triton's
interpreter: absorbed queries against latent rows scattered over the pool through
req_to_token, several requests and head counts off the kernel's head blocks (16 and 64 rows),
and one long request split 128 ways, against a float64 dense computation (and the torch
reference the CPU serves with); the extend path (kernels/mla_extend.py: requests' latents
gathered, expanded and attended together, in one group or several) against the same; the
per-head GEMVs of the absorbed projections (kernels/mla_absorb.py) against torch.bmm; the fused MLA prologue (kernels/mla_rope_store.py) against the torch path; and
the tiny DeepSeek V3 and V2-Lite layouts forced onto their CUDA path against their torch path.
tests/gpu repeats the decode at DeepSeek's sizes in bf16."""

from __future__ import annotations

import pytest
from interpreter_harness import run_interpreted

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted("mla_interpret_check.py")


def test_mla_decode_kernel_matches_dense_reference(interpreted) -> None:
    results = interpreted["decode"]
    assert [r["block_h"] for r in results] == [16, 16, 64]
    assert results[1]["splits"] == 128
    for result in results:
        assert result["rel_err"] < 1e-5, result
        assert result["native_rel_err"] < 1e-5, result


def test_mla_extend_kernel_matches_dense_reference(interpreted) -> None:
    results = interpreted["extend"]
    assert [r["groups"] for r in results] == [1, 3]
    for result in results:
        assert result["groups_kept"], result
        assert result["rel_err"] < 1e-5, result
        assert result["native_rel_err"] < 1e-5, result


def test_absorbed_projections_per_head_match_bmm(interpreted) -> None:
    """W_UK's and W_UV's products at 1-4 rows (kernels/mla_absorb.py) against torch.bmm."""
    results = interpreted["absorb"]
    assert [r["rows"] for r in results] == [1, 3, 4]
    for result in results:
        assert result["rel_err"] < (1e-6 if result["dtype"] == "torch.float32" else 2e-3), result
        assert result["given_equal"], result


def test_rope_norm_store_kernel_matches_the_torch_path(interpreted) -> None:
    """The fused prologue (latent RMSNorm, rotary of the shared key and of every head's query,
    interleaved checkpoints or not, the pool row stored) against DeepseekMLA's torch path."""
    for result in interpreted["rope_store"]:
        assert result["rows_written"] == 7, result
        assert result["q_err"] < 1e-5, result
        assert result["pool_err"] < 1e-5, result


def test_deepseek_cuda_path_matches_its_torch_path(interpreted) -> None:
    """Both layouts forced onto the CUDA path (prologue and MLA decode kernels, the fused MoE
    with DeepSeek's routing) against their torch path over prefill, chunk and decode passes."""
    models = interpreted["models"]
    assert [m["case"] for m in models] == ["tiny-deepseek-v3", "tiny-deepseek-v2-lite"]
    for result in models:
        assert result["rel_err"] < 1e-5, result
        assert result["same_argmax"], result
