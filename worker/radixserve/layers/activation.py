"""SiLU-and-mul over a fused gate/up projection: one matmul produces both halves."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.layers import fused_ops


class SiluAndMul(nn.Module):
    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        # On CUDA one kernel instead of slice, silu and mul (each a launch and a round trip).
        if fused_ops.enabled_for(gate_up):
            return fused_ops.silu_and_mul(gate_up)
        return self.forward_native(gate_up)

    def forward_native(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The torch reference: the CPU path, and what the fused kernel is checked against."""
        d = gate_up.shape[-1] // 2
        return F.silu(gate_up[..., :d]) * gate_up[..., d:]
