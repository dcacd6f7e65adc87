"""MXFP4 (the OCP microscaling 4-bit float format) as gpt-oss checkpoints store their MoE
experts: `*_blocks` [..., groups, 16] uint8, two e2m1 values a byte (the low nibble first),
and `*_scales` [..., groups] uint8, one power of two per group of 32 values (e8m0: 2^(s - 127)).

By default the worker dequantizes them at load, to the model dtype or, under `--quantization
fp8`, on to FP8 with channel scales. `--quantization mxfp4` (`Mxfp4Config`) keeps the experts
in MXFP4 instead (packed [E, N, K / 2] bytes and [E, N, K / 32] scales per layer), for the
fused MoE kernel that dequantizes its tiles as it reads them (weight-only: decode reads a
quarter of bf16's bytes); everything else stays in the model dtype. Values dequantized from
MXFP4 quantize back to themselves, so a checkpoint's experts pass the load unchanged.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from radixserve.layers.linear import Linear
from radixserve.layers.quantization.base import QuantizationConfig

GROUP = 32
# e2m1: the 16 values a nibble codes (sign bit high)
E2M1_VALUES = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)
_SCALE_BIAS = 127
# between neighbouring e2m1 magnitudes: a magnitude's code is the number of these below it
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def dequantize_mxfp4(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """blocks [..., G, 16] uint8 and scales [..., G] uint8 -> [..., G * 32] in `dtype`. Every
    e2m1 value times a power of two is exact in bf16 and float32 (within their exponent range)."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != GROUP // 2:
        raise ValueError(
            f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not pair"
        )
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    codes = blocks.to(torch.uint8)
    values = torch.stack([table[(codes & 0x0F).long()], table[(codes >> 4).long()]], dim=-1)
    values = values.flatten(-2)  # [..., G, 32]: low nibble, high nibble, ...
    exponents = scales.to(torch.int32) - _SCALE_BIAS
    return torch.ldexp(values, exponents.unsqueeze(-1).float()).flatten(-2).to(dtype)


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] -> (blocks [..., K / 32, 16] uint8, scales [..., K / 32] uint8): per group of
    32 the smallest power of two that brings its largest magnitude within e2m1's 6, each value
    rounded to the nearest e2m1 magnitude, its sign in the nibble's top bit (never on a zero:
    the bytes are canonical)."""
    groups = weight.float().unflatten(-1, (-1, GROUP))
    amax = groups.abs().amax(-1).clamp(min=2.0**-126)
    exponent = torch.ceil(torch.log2(amax / 6.0)).clamp(-_SCALE_BIAS, _SCALE_BIAS)
    scaled = groups / torch.exp2(exponent).unsqueeze(-1)
    midpoints = torch.tensor(_MIDPOINTS, device=weight.device)
    magnitudes = torch.bucketize(scaled.abs().contiguous(), midpoints)
    codes = (magnitudes | ((scaled < 0) & (magnitudes > 0)).long() << 3).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exponent + _SCALE_BIAS).to(torch.uint8)


class Mxfp4Config(QuantizationConfig):
    """`--quantization mxfp4`: gpt-oss's MoE experts kept in MXFP4; projections, router,
    embeddings and the LM head in the model dtype."""

    name = "mxfp4"
    keeps_experts_mxfp4 = True

    @classmethod
    def at_load(cls) -> Mxfp4Config:
        return cls()

    def describe(self) -> str:
        return "mxfp4 (MoE experts, dequantized in the kernel)"

    def linear(self, in_features: int, out_features: int, bias: bool) -> nn.Module:
        return Linear(in_features, out_features, bias=bias)

    def load_working_bytes(self, model: nn.Module) -> int:
        """What the load works in beside the read, one expert matrix at a time: about 30 bytes
        a value (the decoded bf16 source, its float32 groups and scaled copy, int64 codes)."""
        values = [
            2 * math.prod(p.shape[-2:])
            for name, p in model.named_parameters()
            if p.dtype == torch.uint8 and name.endswith("_weight")
        ]
        return 30 * max(values, default=0)
