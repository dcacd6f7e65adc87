"""FP8 (e4m3) weights: `--quantization fp8` and pre-quantized FP8 checkpoints.

Every quantized weight is stored the same way whatever it came from: float8_e4m3fn values
and one float32 scale per output channel (real weight = value x scale). A bf16 checkpoint is
quantized at load, row by row (scale = the row's largest magnitude / 448); a checkpoint's
per-tensor scale becomes that value on each of the tensor's rows, a per-channel one is taken
as is; Hugging Face block-wise scales (128 x 128 blocks) are applied at load and the rows
re-quantized per channel (so one kernel path serves every source).

The products, by where they run:
- CUDA, one row (batch-1 decode): the Triton GEMV streams the FP8 rows and scales each sum
  (weight-only: no activation quantization, half the bytes of bf16);
- CUDA on Hopper/Ada, more rows: the activations are quantized per token (a dynamic scale per
  row, one Triton launch) and `torch._scaled_mm` multiplies FP8 by FP8 with both scales;
- anywhere else (the CPU, tests): the weight is dequantized and multiplied in the model dtype.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.kernels.fp8_quant import (
    FP8_DTYPE,
    quantize_per_token,
    quantize_rows,
)
from radixserve.kernels.gemv import block_config, gemv, uses_gemv
from radixserve.layers.activation import silu_and_mul
from radixserve.layers.quantization.base import QuantizationConfig, WeightStream


def dequantize_rows(values: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """values [..., N, K] x scale [..., N], as `dtype`."""
    return (values.float() * scale.float()[..., None]).to(dtype)


def dequantize_blocks(
    values: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]
) -> torch.Tensor:
    """A block-quantized [N, K] weight in float32: block (i, j) of `block` rows x columns is
    multiplied by scale[i, j] (the last blocks may be partial)."""
    rows, cols = values.shape
    expanded = scale.float().repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return values.float() * expanded[:rows, :cols]


@functools.cache
def _has_fp8_tensor_cores(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (8, 9)


def _uses_scaled_mm(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """FP8 x FP8 on the tensor cores: Ada or Hopper, bf16 activations, and the 16-multiples
    `torch._scaled_mm` wants."""
    return (
        x.is_cuda
        and x.dtype == torch.bfloat16
        and weight.shape[0] % 16 == 0
        and weight.shape[1] % 16 == 0
        and _has_fp8_tensor_cores(x.device.index or 0)
    )


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """F.linear(x, weight * scale[:, None], bias) for an FP8 weight [N, K] with channel scales."""
    if uses_gemv(x, weight):
        return gemv(x, weight, bias, *block_config(*weight.shape, fp8=True), scale=scale)
    if _uses_scaled_mm(x, weight):
        rows = x.reshape(-1, x.shape[-1])
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        q, x_scale = quantize_per_token(rows)
        y = torch._scaled_mm(
            q,
            weight.t(),
            scale_a=x_scale,
            scale_b=scale.view(1, -1),
            bias=bias,
            out_dtype=x.dtype,
        )
        return y.view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, dequantize_rows(weight, scale, x.dtype), bias)


class Fp8Linear(nn.Module):
    """A projection with an FP8 weight [out, in] and a float32 scale per output channel."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(
            torch.zeros(out_features, in_features, dtype=FP8_DTYPE), requires_grad=False
        )
        self.weight_scale = nn.Parameter(
            torch.ones(out_features, dtype=torch.float32), requires_grad=False
        )
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.weight, self.weight_scale, self.bias)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of this [gate; up] projection of x (one gated GEMV at batch 1)."""
        if uses_gemv(x, self.weight):
            config = block_config(*self.weight.shape, fp8=True)
            return gemv(x, self.weight, self.bias, *config, gated=True, scale=self.weight_scale)
        return silu_and_mul(self.forward(x))

    @torch.no_grad()
    def load_rows(self, kind: str, start: int, count: int, tensor: torch.Tensor) -> set[str]:
        """Rows [start, start + count) of `kind`: a weight (FP8 as is; anything else quantized
        here, which also writes the rows' scales), its scale (one value for all the rows, or
        one per row), or the bias. Activation scales are not needed: they are per token."""
        rows = slice(start, start + count)
        if kind in ("weight", "bias") and tensor.shape[0] != count:
            raise ValueError(f"{kind}: {tuple(tensor.shape)} checkpoint rows for {count} rows")
        if kind == "weight":
            if tensor.dtype == FP8_DTYPE:
                self.weight[rows].copy_(tensor)
                return {"weight"}
            values, scale = quantize_rows(tensor)
            self.weight[rows].copy_(values)
            self.weight_scale[rows].copy_(scale)
            return {"weight", "weight_scale"}
        if kind == "weight_scale":
            self.weight_scale[rows].copy_(channel_scales(tensor, count))
            return {"weight_scale"}
        if kind == "input_scale":
            return set()
        if kind == "bias" and self.bias is not None:
            self.bias[rows].copy_(tensor)
            return {"bias"}
        raise KeyError(f"an FP8 linear has no parameter {kind!r}")


def channel_scales(scale: torch.Tensor, rows: int) -> torch.Tensor:
    """A checkpoint weight scale as one float32 value per row: per-tensor (one value) or
    per-channel ([rows] or [rows, 1])."""
    flat = scale.float().reshape(-1)
    if flat.numel() == 1:
        return flat.expand(rows)
    if flat.numel() != rows:
        raise ValueError(f"a weight scale of {tuple(scale.shape)} fits neither 1 nor {rows} rows")
    return flat


class Fp8Config(QuantizationConfig):
    name = "fp8"

    def __init__(
        self, checkpoint_format: str | None = None, block_size: tuple[int, int] | None = None
    ) -> None:
        self.checkpoint_format = checkpoint_format
        self.block_size = block_size

    @classmethod
    def at_load(cls) -> Fp8Config:
        """`--quantization fp8` on an unquantized checkpoint."""
        return cls()

    @classmethod
    def from_checkpoint(cls, qc: dict[str, Any]) -> Fp8Config:
        method = str(qc.get("quant_method", "")).lower()
        if method == "fp8":
            block = qc.get("weight_block_size")
            return cls("fp8", tuple(block) if block else None)
        return cls("compressed-tensors")  # its schemes checked by registry.check_quantization

    def describe(self) -> str:
        if self.checkpoint_format is None:
            return "fp8 (quantized at load, per channel)"
        blocks = f", {self.block_size} blocks re-quantized per channel" if self.block_size else ""
        return f"fp8 ({self.checkpoint_format} checkpoint{blocks})"

    def linear(self, in_features: int, out_features: int, bias: bool) -> nn.Module:
        return Fp8Linear(in_features, out_features, bias)

    @property
    def quantize_experts(self) -> bool:
        return True

    def load_working_bytes(self, model: nn.Module) -> int:
        """float32 copies of the largest matrix quantized at once (the weight, its scaled copy
        and the clamped one, `quantize_rows`; a block-scaled checkpoint's dequantized matrix
        first, `dequantize_blocks`), one expert's of stacked experts. None for a per-tensor or
        per-channel FP8 checkpoint, which is copied as stored."""
        if self.checkpoint_format is not None and self.block_size is None:
            return 0
        fp8 = [math.prod(p.shape[-2:]) for p in model.parameters() if p.dtype == FP8_DTYPE]
        return 3 * 4 * max(fp8, default=0)

    def adapt_checkpoint(self, weights: WeightStream) -> WeightStream:
        """Hugging Face FP8 names its (multiplicative) scale `weight_scale_inv`; with blocks
        the weight is dequantized here, to be quantized per channel by its layer."""
        if self.checkpoint_format != "fp8":
            return weights
        if self.block_size is None:
            return (
                (name.removesuffix("_inv") if name.endswith(".weight_scale_inv") else name, t)
                for name, t in weights
            )
        return _apply_block_scales(weights, self.block_size)


def _apply_block_scales(weights: WeightStream, block: tuple[int, int]) -> Iterator:
    """Pair each FP8 `X.weight` with its `X.weight_scale_inv` (in either order) and yield the
    dequantized float32 `X.weight`; every other tensor passes through."""
    pending: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if name.endswith(".weight_scale_inv"):
            prefix, key = name.removesuffix(".weight_scale_inv"), "scale"
        elif name.endswith(".weight") and tensor.dtype == FP8_DTYPE:
            prefix, key = name.removesuffix(".weight"), "weight"
        else:
            yield name, tensor
            continue
        other = "weight" if key == "scale" else "scale"
        partner = pending.pop(f"{prefix}:{other}", None)
        if partner is None:
            pending[f"{prefix}:{key}"] = tensor
            continue
        values, scale = (tensor, partner) if key == "weight" else (partner, tensor)
        yield f"{prefix}.weight", dequantize_blocks(values, scale, block)
    if pending:
        raise ValueError(
            "FP8 checkpoint with block scales has unpaired tensors: "
            f"{sorted(pending)[:4]} (every FP8 weight needs its weight_scale_inv)"
        )
