"""Run DeepSeek's MoE block (models/deepseek_v2.DeepseekMoE) with its Triton kernels in
Triton's CPU interpreter against transformers' own block on the same weights; print one JSON
result line.

Started by test_deepseek_moe_interpret.py in a subprocess (TRITON_INTERPRET must be set before
the kernel modules are imported). One token takes the routed GEMV with the shared experts as
extra slots of its launches, as do two or three (up to 16 routed pairs); nine take the grouped
GEMMs and the shared MLP by itself."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from unittest import mock

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from transformers import DeepseekV2Config, DeepseekV3Config  # noqa: E402
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE  # noqa: E402
from triton_interpret_check import _allow_one_element_index  # noqa: E402

from radixserve.kernels import triton_support  # noqa: E402
from radixserve.kernels.moe_gemv import uses_moe_gemv  # noqa: E402
from radixserve.layers.quantization.fp8 import Fp8Config  # noqa: E402
from radixserve.models.deepseek_v2 import DeepseekMoE  # noqa: E402

_allow_one_element_index()
gen = torch.Generator().manual_seed(0)
SHAPE = {"hidden_size": 64, "num_attention_heads": 4, "n_routed_experts": 8}
# V2-Lite's routing (softmax greedy, two shared experts); V2's (its routed_scaling_factor 16:
# the shared slots must stay at weight 1); V3's (sigmoid over groups, one shared expert)
CONFIGS = {
    "v2-lite": DeepseekV2Config(
        **SHAPE,
        num_experts_per_tok=3,
        n_shared_experts=2,
        moe_intermediate_size=24,
        topk_method="greedy",
        routed_scaling_factor=1.0,
    ),
    "v2 scaled": DeepseekV2Config(
        **SHAPE,
        num_experts_per_tok=6,
        n_shared_experts=2,
        moe_intermediate_size=24,
        topk_method="greedy",
        routed_scaling_factor=16.0,
    ),
    "v3": DeepseekV3Config(
        **SHAPE,
        num_experts_per_tok=2,
        n_shared_experts=1,
        moe_intermediate_size=32,
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
    ),
}


def reference_block(name: str) -> torch.nn.Module:
    """transformers' block for the config, random weights (its own init leaves some empty)."""
    config = CONFIGS[name]
    block = (DeepseekV3MoE if name == "v3" else DeepseekV2Moe)(config).eval()
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
        if name == "v3":
            block.gate.e_score_correction_bias.copy_(torch.randn(8, generator=gen) * 0.3)
    return block


def ours(name: str, reference: torch.nn.Module, quant: Fp8Config | None) -> DeepseekMoE:
    """DeepseekMoE loaded with the reference's weights as the loader writes them."""
    block = DeepseekMoE(CONFIGS[name], quant).eval()
    shared = reference.shared_experts
    with torch.no_grad():
        block.gate.weight.copy_(reference.gate.weight)
        if block.gate.e_score_correction_bias is not None:
            block.gate.e_score_correction_bias.copy_(reference.gate.e_score_correction_bias)
        block.experts.load_expert("gate_up", None, "weight", reference.experts.gate_up_proj)
        block.experts.load_expert("down", None, "weight", reference.experts.down_proj)
        gate_up = torch.cat([shared.gate_proj.weight, shared.up_proj.weight])
        block.shared_experts.gate_up_proj.load_rows("weight", 0, gate_up.shape[0], gate_up)
        down = shared.down_proj.weight
        block.shared_experts.down_proj.load_rows("weight", 0, down.shape[0], down)
    return block


def run(block: DeepseekMoE, x: torch.Tensor, kernels: bool) -> tuple[torch.Tensor, int]:
    """The block's output and how many times its shared MLP ran by itself."""
    shared = block.shared_experts
    with (
        torch.no_grad(),
        mock.patch.object(triton_support, "enabled_for", lambda t: kernels),
        mock.patch.object(shared, "forward", wraps=shared.forward) as shared_forward,
    ):
        out = block(x)
    return out, shared_forward.call_count


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


results = []
for name in CONFIGS:
    reference = reference_block(name)
    block = ours(name, reference, None)
    for tokens in (1, 2, 9):
        x = torch.randn(tokens, SHAPE["hidden_size"], generator=gen)
        with torch.no_grad():
            expected = reference(x[None])[0]
        out, separate = run(block, x, kernels=True)
        results.append(
            {
                "case": f"{name} T={tokens} float32",
                "rel_err": rel(out, expected),
                "shared_ran_by_itself": separate,
                "folded_expected": uses_moe_gemv(tokens, CONFIGS[name].num_experts_per_tok),
            }
        )
    # FP8 (--quantization fp8: experts and the shared MLP's projections per channel), one
    # token in float16: the kernels against the block's own torch path on the same weights
    block = ours(name, reference, Fp8Config.at_load())
    x = torch.randn(1, SHAPE["hidden_size"], generator=gen).half()
    out, separate = run(block, x, kernels=True)
    torch_path, _ = run(block, x, kernels=False)
    results.append(
        {
            "case": f"{name} T=1 fp8",
            "rel_err": rel(out, torch_path),
            "shared_ran_by_itself": separate,
            "folded_expected": True,
        }
    )
print(json.dumps(results))
