"""Run the Triton GEMV, plain and with its folded-in prologues (RMSNorm with and without the
residual add, SiLU-and-mul), in Triton's CPU interpreter; print one JSON result line.

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

from radixserve.layers import gemv as gemv_module  # noqa: E402
from radixserve.layers.gemv import gemv  # noqa: E402
from radixserve.layers.layernorm import RMSNorm  # noqa: E402

_allow_one_element_index()  # the K loop's bound under numpy 2
torch.manual_seed(0)
plain = []
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
            plain.append(
                {
                    "shape": [n, k, bn, bk],
                    "dtype": str(dtype),
                    "bias": with_bias,
                    "out_shape": list(y.shape),
                    "out_dtype": str(y.dtype),
                    "rel_err": ((y.double() - ref).norm() / ref.norm()).item(),
                }
            )

# Prologues, against float64 products of the torch reference ops' inputs: the norm as
# RMSNorm.forward_native computes it, SiLU-and-mul rounded once as fused_ops does
prologue = []
for n, k, bn, bk in [(37, 300, 2, 128), (16, 96, 2, 1024)]:
    for dtype in (torch.float32, torch.float16):
        w = torch.randn(n, k).to(dtype)
        x, r = torch.randn(1, k).to(dtype), torch.randn(1, k).to(dtype)
        norm = RMSNorm(k, eps=1e-5).to(dtype)
        norm.weight.data = (1 + 0.1 * torch.randn(k)).to(dtype)
        for kind in ("norm", "add_norm", "silu_mul"):
            summed = torch.empty_like(x)
            if kind == "norm":
                y = gemv_module._launch(
                    x,
                    w,
                    None,
                    gemv_module._NORM,
                    norm_weight=norm.weight,
                    eps=1e-5,
                    config=(bn, bk, 4),
                )
                ref_in = norm.forward_native(x)
            elif kind == "add_norm":
                y = gemv_module._launch(
                    x,
                    w,
                    None,
                    gemv_module._ADD_NORM,
                    residual=r,
                    norm_weight=norm.weight,
                    residual_out=summed,
                    eps=1e-5,
                    config=(bn, bk, 4),
                )
                ref_in, ref_sum = norm.forward_native(x, r)
            else:
                gate_up = torch.cat([x, r], dim=-1)
                w2 = torch.randn(n, k).to(dtype)
                y = gemv_module._launch(
                    gate_up, w2, None, gemv_module._SILU_MUL, k=k, config=(bn, bk, 4)
                )
                g, u = x.double(), r.double()
                ref_in, w = (g / (1 + torch.exp(-g)) * u).to(dtype), w2
            ref = F.linear(ref_in.double(), w.double())
            prologue.append(
                {
                    "kind": kind,
                    "shape": [n, k, bn, bk],
                    "dtype": str(dtype),
                    "out_shape": list(y.shape),
                    "rel_err": ((y.double() - ref).norm() / ref.norm()).item(),
                    "residual_exact": bool(torch.equal(summed, ref_sum))
                    if kind == "add_norm"
                    else None,
                }
            )
print(json.dumps({"plain": plain, "prologue": prologue}))
