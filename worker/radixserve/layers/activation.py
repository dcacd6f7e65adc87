"""SiLU-and-mul over a fused gate/up projection: one matmul produces both halves."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixserve.layers import fused_ops


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2d] -> [..., d]: silu(gate) * up. On CUDA one kernel instead of slice, silu and
    mul (each a launch and a round trip)."""
    if fused_ops.enabled_for(gate_up):
        return fused_ops.silu_and_mul(gate_up)
    return silu_and_mul_native(gate_up)


def silu_and_mul_native(gate_up: torch.Tensor) -> torch.Tensor:
    """The torch reference: the CPU path, and what the fused kernels are checked against."""
    d = gate_up.shape[-1] // 2
    return F.silu(gate_up[..., :d]) * gate_up[..., d:]
