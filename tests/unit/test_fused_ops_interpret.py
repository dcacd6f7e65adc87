"""The fused Triton kernels of kernels/fused_ops.py, run on the CPU by Triton's interpreter.

RMSNorm (strided per-head views, in place, with the residual add; Gemma's (1 + w) form),
SiLU- and GELU-and-mul, rotary + KV store (with Qwen3's and Gemma 3's q/k norm) and the
req_to_token scatter against the torch code they replace, and tiny Llama, Qwen3 and Qwen3-MoE
models forced onto the fused path against their torch path. tests/gpu/test_fused_ops.py
repeats this at real sizes and in bf16.
"""

from __future__ import annotations

import pytest
from interpreter_harness import run_interpreted

pytest.importorskip("triton")

# max |kernel - reference| / max |reference|. The references round where the kernels do (see
# tests/gpu/test_fused_ops.py), so float32 differs only in summation order and FMA, float16 at
# most by a rounding flip (2**-10 relative).
TOLERANCE = {"torch.float32": 1e-6, "torch.float16": 1e-3}
EXACT = (
    "outside_untouched",
    "v_untouched",
    "v_cache",
    "store_cells",
)  # copies and bystanders: bit for bit


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted("fused_ops_interpret_check.py")


def test_kernels_match_the_torch_code(interpreted) -> None:
    results = interpreted["kernels"]
    assert len(results) == 28
    for result in results:
        for metric, err in result["errors"].items():
            limit = 0.0 if metric in EXACT else TOLERANCE[result["dtype"]]
            assert err <= limit, (metric, result)


def test_fused_model_forward_matches_the_torch_path(interpreted) -> None:
    models = interpreted["models"]
    assert [m["case"] for m in models] == [
        "tiny-llama-torch_native",
        "tiny-qwen3-triton",
        "tiny-qwen3-moe-triton",
    ]
    for result in models:
        assert result["rel_err"] < 1e-5 and result["same_argmax"], result


def test_router_logits_in_the_norm_launch_match_the_torch_path(interpreted) -> None:
    """Batch 1: a MoE router's logits computed in the norm's launch (Qwen3's, gpt-oss's biased,
    DeepSeek's float32 router): taken, in the router's dtype, equal to the norm then the
    router in torch to a rounding, the residual sum exact; a router called on another row
    computes that row's own logits."""
    routers = interpreted["routers"]
    assert [r["case"] for r in routers] == ["qwen3", "gpt-oss", "deepseek"]
    for result in routers:
        assert result["took_the_fused_norm"] and result["dtype_same"], result
        assert result["logits_rel_err"] < 2e-3 and result["normed_rel_err"] < 1e-3, result
        assert result["residual_same"] and result["other_row_same"], result
