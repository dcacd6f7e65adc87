"""What quantizing activations to e4m3 costs on trained weights, on the CPU: SmolLM2-135M (the
bundled model) in float32, against its FP8 weights weight-only (what the batch-1 GEMV
computes) and against its FP8 weights with every FP8 projection's input rounded to e4m3 a
CHUNK of elements at a time, each chunk with its own amax / 448 scale (what the W8A8 product
of branch fp8-wgmma-gemv computes; CHUNK 0: one scale per row, as `_scaled_mm`'s per-token
path). Teacher-forced logits (tests/gpu/test_fused_ops.py's `model_passes`: prompts of 40, 90
and 150 tokens, a chunk, 16 decode steps), cosine similarity and argmax agreement row by row.

Usage: .venv/bin/python scripts/w8a8_cosine_cpu.py [CHUNK]  (CHUNK divides 576 and 1536;
default 192; a few minutes on 2 cores)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
from test_fused_ops import model_passes  # noqa: E402

import radixserve.layers.quantization.fp8 as fp8  # noqa: E402

CHUNK = int(sys.argv[1]) if len(sys.argv) > 1 else 192
weight_only = fp8.fp8_linear


def chunk_quantized(x: torch.Tensor) -> torch.Tensor:
    chunk = CHUNK or x.shape[-1]
    chunks = x.float().reshape(-1, x.shape[-1] // chunk, chunk)
    amax = chunks.abs().amax(-1, keepdim=True).clamp(min=1e-30)
    q = (chunks * (448.0 / amax)).to(torch.float8_e4m3fn).float() * (amax / 448.0)
    return q.reshape(x.shape).to(x.dtype)


def w8a8(x, weight, scale, bias=None):
    return weight_only(chunk_quantized(x), weight, scale, bias)


def logits(quantization: str | None, product) -> list[torch.Tensor]:
    fp8.fp8_linear = product  # Fp8Linear.forward looks it up on the module at each call
    return model_passes(
        "builtin:smollm2-135m",
        "float32",
        "cpu",
        "torch_native",
        False,
        [40, 90, 150],
        decode_steps=16,
        quantization=quantization,
    )


reference = logits(None, weight_only)
for name, product in (("fp8 weight-only", weight_only), (f"fp8 W8A8, chunk {CHUNK}", w8a8)):
    out = logits("fp8", product)
    pairs = list(zip(out, reference, strict=True))
    cosine = torch.cat([torch.cosine_similarity(a.double(), b.double(), dim=-1) for a, b in pairs])
    agree = torch.cat([(a.argmax(-1) == b.argmax(-1)).float() for a, b in pairs])
    print(
        f"{name}: cosine min {cosine.min():.5f} mean {cosine.mean():.5f}, "
        f"argmax agreement {agree.mean():.3f}, {cosine.numel()} rows"
    )
