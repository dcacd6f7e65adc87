"""Run the Triton GEMV in Triton's CPU interpreter; print one JSON result line.

Started by test_gemv_interpret.py in a subprocess: TRITON_INTERPRET must be set before the
kernel module is imported and must not leak into the rest of the test session."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from triton_interpret_check import _allow_one_element_index  # noqa: E402

from radixserve.kernels.fused_ops import silu_and_mul  # noqa: E402
from radixserve.kernels.gemv import gemv  # noqa: E402
from radixserve.layers.quantization.fp8 import dequantize_rows, quantize_rows  # noqa: E402

_allow_one_element_index()  # the K loop's bound under numpy 2
torch.manual_seed(0)
cases = []
# (N, K, rows per program, K chunk): ragged N and K against the blocks, one-row programs,
# chunks longer than K, the shipped configurations
for n, k, bn, bk in [(37, 300, 2, 128), (64, 256, 1, 256), (5, 1000, 8, 512), (33, 96, 2, 1024)]:
    for dtype in (torch.float32, torch.float16):
        for with_bias in (False, True):
            w = torch.randn(n, k).to(dtype)
            x = torch.randn(1, k).to(dtype)
            b = torch.randn(n).to(dtype) if with_bias else None
            ref = F.linear(x.double(), w.double(), None if b is None else b.double())
            y = gemv(x, w, b, bn, bk, 4)
            cases.append(
                {
                    "shape": [n, k, bn, bk],
                    "dtype": str(dtype),
                    "bias": with_bias,
                    "out_shape": list(y.shape),
                    "out_dtype": str(y.dtype),
                    "rel_err": ((y.double() - ref).norm() / ref.norm()).item(),
                }
            )
# float32 output of a float16 product: exactly `.float()` of the float16 result
widened = []
for n, k, bn, bk in [(37, 300, 2, 128), (33, 96, 2, 1024)]:
    w = torch.randn(n, k).to(torch.float16)
    x = torch.randn(1, k).to(torch.float16)
    wide = gemv(x, w, None, bn, bk, 4, out_dtype=torch.float32)
    widened.append(
        {
            "dtype": str(wide.dtype),
            "exact": bool(torch.equal(wide, gemv(x, w, None, bn, bk, 4).float())),
        }
    )
# [gate; up] with the activation in the epilogue: the same values as the product followed by
# the activation kernel (both rounded to the activation dtype, then silu(gate) * up in float32)
gated = []
for n, k, bn, bk in [(74, 300, 2, 128), (66, 96, 4, 1024), (10, 1000, 1, 512)]:
    for with_bias in (False, True):
        w = torch.randn(n, k).to(torch.float16)
        x = torch.randn(1, k).to(torch.float16)
        b = torch.randn(n).to(torch.float16) if with_bias else None
        fused = gemv(x, w, b, bn, bk, 4, gated=True)
        two_step = silu_and_mul(gemv(x, w, b, max(1, bn // 2), bk, 4))
        ref = F.linear(x.double(), w.double(), None if b is None else b.double())
        ref = F.silu(ref[:, : n // 2]) * ref[:, n // 2 :]
        gated.append(
            {
                "shape": [n, k, bn, bk],
                "out_shape": list(fused.shape),
                "same_as_two_kernels": bool(torch.equal(fused, two_step)),
                "rel_err": ((fused.double() - ref).norm() / ref.norm()).item(),
            }
        )
# FP8 weights with one scale per row (weight-only FP8 at batch 1), plain and gated, against
# the dequantized weight in float64
fp8 = []
for n, k, bn, bk in [(38, 300, 2, 128), (66, 96, 4, 1024)]:
    for gated_case in (False, True):
        values, scale = quantize_rows(torch.randn(n, k))
        x = torch.randn(1, k).to(torch.float16)
        b = torch.randn(n).to(torch.float16)
        y = gemv(x, values, b, bn, bk, 4, gated=gated_case, scale=scale)
        ref = F.linear(x.double(), dequantize_rows(values, scale, torch.float64), b.double())
        if gated_case:
            ref = F.silu(ref[:, : n // 2]) * ref[:, n // 2 :]
        fp8.append(
            {
                "shape": [n, k, bn, bk, gated_case],
                "out_shape": list(y.shape),
                "rel_err": ((y.double() - ref).norm() / ref.norm()).item(),
            }
        )
print(json.dumps({"cases": cases, "widened": widened, "gated": gated, "fp8": fp8}))
