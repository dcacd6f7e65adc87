"""RMSNorm, with the residual add fused into the same call (one read of the residual stream),
and Gemma's variant, which scales by (1 + weight) in float32."""

from __future__ import annotations

import torch
from torch import nn

from radixserve.kernels import fused_ops, triton_support


class RMSNorm(nn.Module):
    # Gemma: normalise and scale by (1 + weight) in float32, round once
    unit_offset = False

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without `residual`: norm(x). With it: (norm(x + residual), x + residual).

        On CUDA one fused kernel, and with `residual` it works in place: the results are
        written over x and residual, so callers must own both (the decoder layers do)."""
        if not triton_support.enabled_for(x):
            return self.forward_native(x, residual)
        eps = self.variance_epsilon
        if residual is None:
            return fused_ops.rms_norm(x, self.weight, eps, unit_offset=self.unit_offset)
        return fused_ops.fused_add_rms_norm(x, residual, self.weight, eps, self.unit_offset)

    def forward_native(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The torch reference: the CPU path, and what the fused kernels are checked against."""
        if residual is not None:
            x = x + residual
            residual = x
        input_dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        if self.unit_offset:
            out = (h * (1.0 + self.weight.float())).to(input_dtype)
        else:
            # the Llama reference: normalise in float32, scale in x's dtype
            out = self.weight * h.to(input_dtype)
        return out if residual is None else (out, residual)

    def with_row_projection(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        weight: torch.Tensor,
        out_dtype: torch.dtype,
        bias: torch.Tensor | None = None,
        slot: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This norm of one row x (after the residual add) and a small projection of the normed
        row in one launch (`fused_ops.norm_project_row`; `weight`, `bias`, `slot` as it takes
        them): (norm(x + residual), x + residual (x without a residual), the projection), the
        values of `forward` (Llama's and Gemma's scaling) and of the projection after it. The
        caller says when one row qualifies (a half-precision row on the GPU at batch 1)."""
        normed, summed, projected = fused_ops.norm_project_row(
            x,
            residual,
            self.weight,
            self.variance_epsilon,
            self.unit_offset,
            weight,
            out_dtype,
            bias=bias,
            slot=slot,
        )
        return normed, summed if summed is not None else x, projected


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: weights stored as offsets from 1 (zeros is the identity scale)."""

    unit_offset = True
