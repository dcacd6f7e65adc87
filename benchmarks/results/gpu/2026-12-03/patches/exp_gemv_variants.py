"""EXPERIMENT (2026-12-03): the persistent GEMV alone, and the folded norm / residual GEMV
checked against torch on the GPU. Usage: python3 scripts/gpu/exp_gemv_variants.py OUT.json"""

import json
import sys

import torch
import torch.nn.functional as F
from l2_cold import copies, microseconds

from radixserve.layers.gemv import block_config, gemv
from radixserve.layers.quantization.fp8 import dequantize_rows, quantize_rows

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
out = {"checks": [], "alone": {}}
torch.manual_seed(0)
for name, (n, k) in SHAPES.items():
    gated = name == "gate_up"
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    values, scale = quantize_rows(w)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    g = torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5
    # persistent == plain, bit for bit
    for fp8 in (False, True):
        tile = block_config(n, k, fp8)
        args = (values, None) if fp8 else (w, None)
        s = scale if fp8 else None
        plain = gemv(x, args[0], None, *tile, gated=gated, scale=s)
        for pps in (1, 2, 4, 8):
            pers = gemv(x, args[0], None, *tile[:4], pps, gated=gated, scale=s)
            out["checks"].append({"case": f"{name} fp8={fp8} pps={pps}", "equal": bool(torch.equal(plain, pers))})
        # folded norm prologue against norm-then-product
        ww = dequantize_rows(values, scale, torch.float32) if fp8 else w.float()
        h = x.float()
        normed = (g.float() * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16).float()).to(torch.bfloat16).float()
        ref = F.linear(normed, ww)
        if gated:
            ref = F.silu(ref[:, : n // 2]) * ref[:, n // 2 :]
        y = gemv(x, args[0], None, *tile, gated=gated, scale=s, norm_weight=g, eps=1e-5)
        err = ((y.float() - ref).norm() / ref.norm()).item()
        unfolded = gemv(normed.to(torch.bfloat16), args[0], None, *tile, gated=gated, scale=s)
        err0 = ((unfolded.float() - ref).norm() / ref.norm()).item()
        out["checks"].append({"case": f"{name} fp8={fp8} norm", "rel_err": err, "unfolded_rel_err": err0})
        if not gated:
            r = torch.randn(1, n, device="cuda", dtype=torch.bfloat16)
            expect = (gemv(x, args[0], None, *tile, scale=s).float() + r.float()).to(torch.bfloat16)
            got = gemv(x, args[0], None, *tile, scale=s, residual=r.clone())
            out["checks"].append({"case": f"{name} fp8={fp8} residual", "equal": bool(torch.equal(got, expect))})
print(json.dumps(out["checks"], indent=0), flush=True)
for name, (n, k) in SHAPES.items():
    gated = name == "gate_up"
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    values, scale = quantize_rows(w)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    row = out["alone"][name] = {}
    for fp8 in (True, False):
        reps = copies(values, scale) if fp8 else copies(w)
        tiles = [block_config(n, k, fp8)]
        tiles += [(8, 512, 2, 4), (8, 1024, 2, 3), (8, 1024, 4, 3), (16, 1024, 4, 3)] if fp8 else [(2, 2048, 2, 1), (4, 1024, 2, 3), (8, 1024, 4, 3)]
        for tile in dict.fromkeys(tiles):
            for pps in (0, 2, 4, 8):
                if fp8:
                    run = lambda v, s, t=tile, p=pps: gemv(x, v, None, *t[:4], p, gated=gated, scale=s)  # noqa: E731
                else:
                    run = lambda v, t=tile, p=pps: gemv(x, v, None, *t[:4], p, gated=gated)  # noqa: E731
                try:
                    us = microseconds(run, reps)
                except Exception as e:  # noqa: BLE001
                    us = str(e)[:80]
                row[f"{'fp8' if fp8 else 'bf16'} {tile} pps={pps}"] = us
                print(name, "fp8" if fp8 else "bf16", tile, pps, us, flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
