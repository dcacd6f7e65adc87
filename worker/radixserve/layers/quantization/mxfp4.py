"""MXFP4 (the OCP microscaling 4-bit float format) as gpt-oss checkpoints store their MoE
experts: `*_blocks` [..., groups, 16] uint8, two e2m1 values a byte (the low nibble first),
and `*_scales` [..., groups] uint8, one power of two per group of 32 values (e8m0: 2^(s - 127)).

The worker dequantizes them at load, to the model dtype or, under `--quantization fp8`, on to
FP8 with channel scales (the experts' own path); nothing runs in MXFP4. A checkpoint's other
tensors (attention, router, embeddings) are stored unquantized.
"""

from __future__ import annotations

import torch

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
