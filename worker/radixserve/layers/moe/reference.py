"""The MoE reference in plain torch: what the fused kernels (kernels/fused_moe.py) are checked
against, and what the CPU runs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixserve.layers.activation import (
    clamped_swiglu_native,
    gelu_tanh_and_mul_native,
    silu_and_mul_native,
)
from radixserve.layers.quantization.fp8 import dequantize_rows
from radixserve.layers.quantization.mxfp4 import GROUP, dequantize_mxfp4


def dequantize_experts(weight: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype):
    """[E, N, K] expert weights as `dtype`: FP8 ones times their [E, N] channel scales, MXFP4
    ones (uint8 [E, N, K / 2] with [E, N, K / 32] scales) decoded."""
    if scale is None:
        return weight.to(dtype)
    if weight.dtype == torch.uint8:
        return dequantize_mxfp4(weight.unflatten(-1, (-1, GROUP // 2)), scale, dtype)
    return dequantize_rows(weight, scale, dtype)


def fused_moe_native(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    expert_use: torch.Tensor | None = None,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    swiglu: tuple[float, float] = (1.702, 7.0),
) -> torch.Tensor:
    """The reference: expert by expert in ascending id, each over the tokens that chose it,
    results weighted and accumulated per token in that order (transformers' own loop).
    `expert_use` [2], if given, accumulates (experts used, passes) as `fused_moe`'s does;
    biases are added after each product; swiglu: (alpha, limit) of the clamped SwiGLU."""
    acts = {
        "silu": silu_and_mul_native,
        "swiglu_oai": lambda gate_up: clamped_swiglu_native(gate_up, *swiglu),
    }
    act = acts.get(activation, gelu_tanh_and_mul_native)
    out = torch.zeros_like(hidden)
    experts = torch.unique(topk_ids).tolist()
    if expert_use is not None:
        expert_use[0] += len(experts)
        expert_use[1] += 1
    for expert in experts:
        tokens, slots = torch.where(topk_ids == expert)
        gate_up = dequantize_experts(w13[expert], _row(w13_scale, expert), hidden.dtype)
        down = dequantize_experts(w2[expert], _row(w2_scale, expert), hidden.dtype)
        gated = act(F.linear(hidden[tokens], gate_up, _row(w13_bias, expert)))
        y = F.linear(gated, down, _row(w2_bias, expert))
        y = y * topk_weights[tokens, slots, None]
        out.index_add_(0, tokens, y.to(out.dtype))
    return out


def _row(scale: torch.Tensor | None, expert: int) -> torch.Tensor | None:
    return None if scale is None else scale[expert]
