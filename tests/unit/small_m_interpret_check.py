"""Run the small-M projection kernel in Triton's CPU interpreter; print one JSON result line.

Started by test_small_m_interpret.py in a subprocess: TRITON_INTERPRET must be set before the
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
from radixserve.kernels.small_m import small_m  # noqa: E402
from radixserve.layers.quantization.fp8 import dequantize_rows, quantize_rows  # noqa: E402

_allow_one_element_index()  # the K loop's bound under numpy 2
torch.manual_seed(0)
ROWS = (2, 3, 5, 8, 16)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


cases = []
# (N, K, config (rows, chunk, warps = the chunk's parts, stages)): ragged N and K against the
# blocks, 32 rows a program, K a multiple of the chunk (no K mask), a chunk longer than K, one,
# two and four parts, two stages
for n, k, config in [
    (37, 300, (16, 128, 4, 1)),
    (64, 256, (32, 128, 4, 2)),
    (5, 1000, (16, 512, 2, 1)),
    (33, 96, (16, 1024, 1, 1)),
]:
    for dtype in (torch.float32, torch.float16):
        w = torch.randn(n, k).to(dtype)
        b = torch.randn(n).to(dtype)
        x = torch.randn(16, k).to(dtype)
        full = small_m(x, w, b, config=config)
        for m in ROWS:
            with_bias = m % 2 == 1  # odd row counts with the bias, even without
            bias = b if with_bias else None
            y = small_m(x[:m], w, bias, config=config)
            ref = F.linear(x[:m].double(), w.double(), None if bias is None else bias.double())
            cases.append(
                {
                    "shape": [m, n, k, *config],
                    "dtype": str(dtype),
                    "bias": with_bias,
                    "out_shape": list(y.shape),
                    "out_dtype": str(y.dtype),
                    "rel_err": rel_err(y, ref),
                    # row r's sum does not depend on how many rows ride along
                    "rows_of_16": bool(torch.equal(y, full[:m])) if with_bias else None,
                }
            )
# float32 output of a float16 product: exactly `.float()` of the float16 result
widened = []
for n, k, config in [(37, 300, (16, 128, 4, 1)), (33, 96, (16, 1024, 4, 1))]:
    w = torch.randn(n, k).to(torch.float16)
    x = torch.randn(5, k).to(torch.float16)
    wide = small_m(x, w, out_dtype=torch.float32, config=config)
    plain = small_m(x, w, config=config)
    widened.append({"dtype": str(wide.dtype), "exact": bool(torch.equal(wide, plain.float()))})
# [gate; up] with the activation in the epilogue: the values of each half's product followed by
# the activation kernel (both round the products to the activation dtype, then silu(gate) * up
# in float32). Each half's own product, so that a row sits where it sits in the gated kernel's
# tiles: the interpreter's dot (numpy) may round a row differently at another place in a tile
gated = []
for n, k, config in [
    (74, 300, (16, 128, 4, 1)),
    (66, 96, (32, 1024, 4, 2)),
    (10, 1024, (16, 512, 2, 1)),
]:
    for m in (2, 5, 16):
        b = torch.randn(n).to(torch.float16) if m != 2 else None
        w = torch.randn(n, k).to(torch.float16)
        x = torch.randn(m, k).to(torch.float16)
        fused = small_m(x, w, b, gated=True, config=config)
        b_halves = (None, None) if b is None else b.chunk(2)
        halves = [
            small_m(x, half, b_half, config=config)
            for half, b_half in zip(w.chunk(2), b_halves, strict=True)
        ]
        two_step = silu_and_mul(torch.cat(halves, dim=1))
        ref = F.linear(x.double(), w.double(), None if b is None else b.double())
        ref = F.silu(ref[:, : n // 2]) * ref[:, n // 2 :]
        gated.append(
            {
                "shape": [m, n, k, *config],
                "out_shape": list(fused.shape),
                "same_as_two_kernels": bool(torch.equal(fused, two_step)),
                "rel_err": rel_err(fused, ref),
            }
        )
# FP8 weights with one scale per row (weight-only), plain and gated, against the dequantized
# weight in float64
fp8 = []
for n, k, config in [(38, 300, (16, 128, 4, 1)), (66, 96, (16, 512, 4, 1))]:
    for m in (3, 8):
        for gated_case in (False, True):
            values, scale = quantize_rows(torch.randn(n, k))
            x = torch.randn(m, k).to(torch.float16)
            b = torch.randn(n).to(torch.float16)
            y = small_m(x, values, b, gated=gated_case, scale=scale, config=config)
            ref = F.linear(x.double(), dequantize_rows(values, scale, torch.float64), b.double())
            if gated_case:
                ref = F.silu(ref[:, : n // 2]) * ref[:, n // 2 :]
            fp8.append(
                {
                    "shape": [m, n, k, gated_case],
                    "out_shape": list(y.shape),
                    "rel_err": rel_err(y, ref),
                }
            )
print(json.dumps({"cases": cases, "widened": widened, "gated": gated, "fp8": fp8}))
