"""MoE routers whose logits can come out of the norm's launch before them.

At batch 1 a router is a tiny projection (32-256 experts of the hidden state) right behind the
layer's post-attention norm, and its own GEMV launch costs more than its bytes. When the decoder
layer asks (`LlamaDecoderLayer.norm_before`), `norm_and_project` runs the norm and the logits in
one launch (`fused_ops.norm_project_row`) and keeps the logits for the router's next call on
exactly that normed row; any other call computes its own.
"""

from __future__ import annotations

import torch

from radixserve.kernels import fused_ops, triton_support
from radixserve.layers.layernorm import RMSNorm
from radixserve.layers.linear import Linear


class LogitsAfterNorm:
    """The norm-and-logits launch and the logits it keeps, for a router with `weight` [experts,
    hidden] (and optionally `bias`): a mixin, whose router says `logits_dtype`."""

    weight: torch.Tensor
    _after_norm: tuple[torch.Tensor, torch.Tensor] | None = None

    def logits_dtype(self, x: torch.Tensor) -> torch.dtype:
        raise NotImplementedError

    def norm_and_project(
        self, norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(norm(x + residual), x + residual) (x as the residual without one) with this
        router's logits of the normed row in the same launch, for one half-precision row on
        the GPU; None elsewhere (the caller runs the norm)."""
        if not (
            triton_support.enabled_for(x)
            and x.dim() == 2
            and x.shape[0] == 1
            and x.dtype in (torch.bfloat16, torch.float16)
            and self.weight.shape[0] <= fused_ops.NORM_PROJECT_MAX_ROWS
        ):
            return None
        normed, summed, logits = norm.with_row_projection(
            x, residual, self.weight, self.logits_dtype(x), bias=getattr(self, "bias", None)
        )
        self._after_norm = (normed, logits)
        return normed, summed

    def logits_after_norm(self, x: torch.Tensor) -> torch.Tensor | None:
        """The logits `norm_and_project` computed, if x is exactly the row it normed."""
        kept, self._after_norm = self._after_norm, None
        return kept[1] if kept is not None and kept[0] is x else None


class RouterLinear(LogitsAfterNorm, Linear):
    """A model-dtype router (Qwen3-MoE's and Mixtral's `gate`, gpt-oss's biased `router`): the
    plain Linear, whose logits may come from the norm's launch."""

    def logits_dtype(self, x: torch.Tensor) -> torch.dtype:
        return x.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.logits_after_norm(x)
        return logits if logits is not None else super().forward(x)
