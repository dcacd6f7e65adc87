"""SiLU-and-mul over a fused gate/up projection: one matmul produces both halves."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        d = gate_up.shape[-1] // 2
        return F.silu(gate_up[..., :d]) * gate_up[..., d:]
