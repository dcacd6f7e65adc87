"""`linear` and the `Linear` layer: a projection that takes the batch-1 GEMV kernel where it
applies (kernels/gemv.py), the skinny GEMM at 2-16 rows on the devices and shapes it was
measured faster on (kernels/skinny_gemm.py) and cuBLAS elsewhere, and `linear_silu_and_mul`,
which applies the MLP's activation in the GEMV's or the skinny GEMM's epilogue."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.kernels.gemv import block_config, gemv, uses_gemv
from radixserve.kernels.skinny_gemm import skinny_gemm, skinny_tile
from radixserve.layers.activation import silu_and_mul


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """F.linear(x, weight, bias).to(out_dtype), through the GEMV where `uses_gemv` says so and
    the skinny GEMM where `skinny_tile` names a tile.

    `out_dtype=torch.float32` is for the logits: the GEMV stores the half-precision product
    widened, the same values as `.float()` of it, without a cast kernel (4 us a step at a 128k
    vocabulary)."""
    if uses_gemv(x, weight):
        return gemv(x, weight, bias, *block_config(*weight.shape), out_dtype=out_dtype)
    if tile := skinny_tile(x, weight):
        return skinny_gemm(x, weight, bias, tile, out_dtype=out_dtype)
    y = F.linear(x, weight, bias)
    return y if out_dtype is None else y.to(out_dtype)


def linear_silu_and_mul(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """silu(gate) * up of the fused [gate; up] projection `weight`: one GEMV launch with the
    activation in its epilogue where `uses_gemv` says so or `skinny_tile` names a tile (the
    activation kernel and its launch gap were about 2.5 us a layer of a 1B batch-1 step), else
    the product and then the activation kernel."""
    if uses_gemv(x, weight):
        return gemv(x, weight, bias, *block_config(*weight.shape), gated=True)
    if tile := skinny_tile(x, weight, gated=True):
        return skinny_gemm(x, weight, bias, tile, gated=True)
    return silu_and_mul(linear(x, weight, bias))


class Linear(nn.Linear):
    """nn.Linear (same parameters, same checkpoint names) whose batch-1 products on CUDA run
    the GEMV. `load_rows` is the loading protocol the quantized linears share."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of this [gate; up] projection of x."""
        return linear_silu_and_mul(x, self.weight, self.bias)

    @torch.no_grad()
    def load_rows(self, kind: str, start: int, count: int, tensor: torch.Tensor) -> set[str]:
        """Copy checkpoint rows [start, start + count) of parameter `kind` (weight or bias);
        the names of the parameters written."""
        target = getattr(self, kind)[start : start + count]
        if target.shape != tensor.shape:
            raise ValueError(
                f"{kind}: checkpoint rows {tuple(tensor.shape)} != {tuple(target.shape)}"
            )
        target.copy_(tensor)
        return {kind}
