"""The fused MoE kernels (routing, sort-by-expert alignment, the two grouped GEMMs with the
activation and the routing weights in their epilogues; the routed GEMV of a few tokens), run
on the CPU by Triton's interpreter against the torch reference in float64, including experts
no token chose and FP8 and MXFP4 expert weights; and the reference itself against a dense
computation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from interpreter_harness import run_interpreted

from radixserve.kernels.fused_moe import select_experts_native
from radixserve.layers.activation import clamped_swiglu_native
from radixserve.layers.moe.reference import fused_moe_native

TOLERANCE = {"torch.float32": 1e-6, "torch.float16": 2e-3}


@pytest.fixture(scope="module")
def interpreted() -> dict:
    pytest.importorskip("triton")
    return run_interpreted("moe_interpret_check.py")


def test_routing_kernel_matches_torch(interpreted):
    assert len(interpreted["routing"]) == 3
    for case in interpreted["routing"]:
        assert case["same_ids"], case
        assert case["max_weight_err"] < 1e-6, case


def test_grouped_noaux_tc_routing_kernel_matches_torch(interpreted):
    """DeepSeek-V3's grouped routing with the correction bias in one kernel: the same experts
    and weights as the torch routing (V3's 8 groups of 32, one group, groups of 6 padded to 8)."""
    cases = interpreted["noaux_tc"]
    assert len(cases) == 3
    for case in cases:
        assert case["same_ids"], case
        assert case["max_weight_err"] < 1e-6, case


def test_alignment_sorts_every_pair_into_its_experts_blocks(interpreted):
    assert len(interpreted["alignment"]) == 5
    for case in interpreted["alignment"]:
        assert all(v for k, v in case.items() if k != "case"), case


def test_topk_sum_rounds_as_torchs_sum_then_add(interpreted):
    """The grouped GEMMs' last launch: each token's k rows summed in float32 and rounded once,
    the shared experts' output added after and rounded again. Six half-precision values of
    these sizes sum exactly in float32, so in float16 every element is float64's sum rounded
    (once, then again after the add); in float32 only the order of the adds may differ."""
    cases = interpreted["topk_sum"]
    assert len(cases) == 4
    for case in cases:
        if case["case"][0] == "torch.float16":
            assert case["ulps_off"] == 0, case
        else:
            assert case["max_err"] < 1e-5, case


def test_fused_moe_matches_reference_with_idle_experts(interpreted):
    cases = interpreted["moe"]
    assert len(cases) == 6
    assert all(case["idle_experts"] > 0 for case in cases)
    for case in cases:
        assert case["shape_ok"], case
        assert case["rel_err"] < TOLERANCE[case["dtype"]], case
        assert case["native_rel_err"] < TOLERANCE[case["dtype"]], case


def test_fused_moe_fp8_experts_match_dequantized_reference(interpreted):
    assert len(interpreted["fp8"]) == 3
    for case in interpreted["fp8"]:
        assert case["rel_err"] < TOLERANCE["torch.float16"], case


def test_fused_moe_biases_and_clamped_swiglu_match_reference(interpreted):
    """gpt-oss's experts: biased products and the clamped SwiGLU, the clamp in play."""
    assert len(interpreted["swiglu"]) == 2
    for case in interpreted["swiglu"]:
        assert case["clamped"] > 0.05, case
        assert case["rel_err"] < TOLERANCE[case["dtype"]], case


def test_fused_moe_mxfp4_experts_match_decoded_reference(interpreted):
    """MXFP4 weights decoded tile by tile in the kernel, and by the CPU reference, as the
    float64 computation on the decoded weights."""
    assert len(interpreted["mxfp4"]) == 2
    for case in interpreted["mxfp4"]:
        assert case["rel_err"] < TOLERANCE[case["dtype"]], case
        assert case["native_rel_err"] < TOLERANCE[case["dtype"]], case


def test_routed_gemv_matches_reference(interpreted):
    """The few-token path (moe_gemv.py) with multi-chunk K loops and partial row blocks, alone
    and as `fused_moe` picks it by itself: idle experts, every slot on one expert, three tokens,
    FP8, gpt-oss's biases with the clamps biting, MXFP4; `expert_use` counts distinct experts."""
    cases = interpreted["gemv"]
    assert len(cases) == 16
    assert any("one-expert" in case["case"] for case in cases)
    for case in cases:
        assert case["shape_ok"], case
        assert case["rel_err"] < TOLERANCE[case["dtype"]], case
        assert case["auto_rel_err"] < TOLERANCE[case["dtype"]], case
        assert case["expert_use"] == case["auto_expert_use"] == case["expected_use"], case
        assert case.get("clamped", 1.0) > 0.05, case


def test_routed_gemv_pipelined_loops_sum_as_the_plain_ones(interpreted):
    """`GemvTiles` stages > 1 (the K loops software-pipelined) gives the plain loops' result."""
    case = interpreted["pipelined"]
    assert case["same"] and case["norm"] > 0, case


def test_shared_experts_add_in_the_epilogue_and_after_the_sum(interpreted):
    """DeepSeek's shared experts' output added to the routed sum: in the down GEMV's epilogue
    (a few tokens) and after the grouped GEMMs' sum, against the reference plus it."""
    cases = interpreted["add"]
    assert [c["case"] for c in cases] == ["gemv", "grouped"] * 2
    for case in cases:
        assert case["rel_err"] < TOLERANCE[case["dtype"]], case


def test_router_gemv_is_the_float32_product(interpreted):
    """DeepSeek's float32 router as one GEMV: partial expert blocks and K chunks, float32 and
    half activations, against the float64 product."""
    cases = interpreted["router"]
    assert len(cases) == 2
    for case in cases:
        assert case["float32"], case
        assert case["rel_err"] < 1e-6, case


def test_mxfp4_decode_is_bit_exact(interpreted):
    """The kernels' e2m1 and scale decode, built from bit patterns, equals the CPU's for every
    byte and for scale bytes from the subnormal 2^-127 to 2^127 (where the largest overflow)."""
    decode = interpreted["mxfp4_decode"]
    assert decode["bit_exact"], decode
    assert decode["infinite"] > 0 and decode["subnormal_scale_nonzero"] > 0, decode


def test_clamped_swiglu_reference_is_gpt_oss_activation():
    """The reference activation on [gate; up] halves against transformers' GptOssExperts
    gate, which reads them interleaved."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GptOssConfig(swiglu_limit=1.0)
    experts = transformers.models.gpt_oss.modeling_gpt_oss.GptOssExperts(config)
    gate_up = torch.randn(5, 2 * 16, generator=torch.Generator().manual_seed(1)) * 3
    interleaved = torch.stack([gate_up[:, :16], gate_up[:, 16:]], dim=-1).reshape(5, 32)
    expected = experts._apply_gate(interleaved)
    assert torch.equal(clamped_swiglu_native(gate_up, config.swiglu_alpha, 1.0), expected)


def test_reference_is_the_dense_mixture():
    """Every token's output is the routing-weighted sum of its experts' MLPs."""
    gen = torch.Generator().manual_seed(3)
    tokens, experts, hidden, inter, top_k = 5, 6, 16, 12, 2
    x = torch.randn(tokens, hidden, generator=gen, dtype=torch.float64)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen, dtype=torch.float64)
    w2 = torch.randn(experts, hidden, inter, generator=gen, dtype=torch.float64)
    weights, ids = select_experts_native(
        torch.randn(tokens, experts, generator=gen), top_k, renormalize=True, round_weights=False
    )
    assert torch.allclose(weights.sum(-1), torch.ones(tokens))
    out = fused_moe_native(x, w13, w2, weights.double(), ids)
    for t in range(tokens):
        expected = sum(
            weights[t, j].item()
            * F.linear(
                F.silu(F.linear(x[t], w13[e, :inter])) * F.linear(x[t], w13[e, inter:]), w2[e]
            )
            for j, e in enumerate(ids[t].tolist())
        )
        assert torch.allclose(out[t], expected)
