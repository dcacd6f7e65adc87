"""Gated activations over a fused gate/up projection: one matmul produces both halves.
SiLU (Llama, Qwen, Mistral, the MoE experts), GELU with the tanh approximation (Gemma), and
gpt-oss's clamped SwiGLU (its experts only: the fused MoE kernel applies it on CUDA)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixserve.kernels import fused_ops, triton_support

GATED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2d] -> [..., d]: silu(gate) * up. On CUDA one kernel instead of slice, silu and
    mul (each a launch and a round trip)."""
    if triton_support.enabled_for(gate_up):
        return fused_ops.silu_and_mul(gate_up)
    return silu_and_mul_native(gate_up)


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2d] -> [..., d]: gelu_tanh(gate) * up, one kernel on CUDA."""
    if triton_support.enabled_for(gate_up):
        return fused_ops.gelu_tanh_and_mul(gate_up)
    return gelu_tanh_and_mul_native(gate_up)


def silu_and_mul_native(gate_up: torch.Tensor) -> torch.Tensor:
    """The torch reference: the CPU path, and what the fused kernels are checked against."""
    d = gate_up.shape[-1] // 2
    return F.silu(gate_up[..., :d]) * gate_up[..., d:]


def gelu_tanh_and_mul_native(gate_up: torch.Tensor) -> torch.Tensor:
    """The torch reference of `gelu_tanh_and_mul` (transformers' `gelu_pytorch_tanh`)."""
    d = gate_up.shape[-1] // 2
    return F.gelu(gate_up[..., :d], approximate="tanh") * gate_up[..., d:]


def clamped_swiglu_native(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """[..., 2d] ([gate; up]) -> [..., d]: gpt-oss's (clamp(up, -l, l) + 1) * g * sigmoid(alpha
    * g) with g = min(gate, l), the limit bounding the activations of its MXFP4 experts."""
    d = gate_up.shape[-1] // 2
    gate = gate_up[..., :d].clamp(max=limit)
    up = gate_up[..., d:].clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def gated_activation(name: str):
    """The `act(gate) * up` function a config's `hidden_act`/`hidden_activation` names."""
    if name == "silu":
        return silu_and_mul
    if name in ("gelu_pytorch_tanh", "gelu_tanh"):
        return gelu_tanh_and_mul
    raise ValueError(f"unsupported activation {name!r}; supported: {', '.join(GATED_ACTIVATIONS)}")
