"""Run the skinny GEMM in Triton's CPU interpreter; print one JSON result line.

Started by test_skinny_gemm_interpret.py in a subprocess: TRITON_INTERPRET must be set before
the kernel module is imported and must not leak into the rest of the test session."""

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
from radixserve.kernels.skinny_gemm import skinny_gemm  # noqa: E402

_allow_one_element_index()  # the K loop's bound under numpy 2
torch.manual_seed(0)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


# (rows, N, K, tile): 2 rows to all 16, N ragged against the features per program, K ragged
# against the chunk (the masked loop) and a multiple of it (the unmasked one), one chunk longer
# than K; then a tile of the H100's table (kernels/skinny_gemm.py SKINNY_TILES) at a small width
plain = []
for m, n, k, tile in [
    (2, 37, 300, (32, 64, 4, 1)),
    (5, 64, 256, (32, 128, 4, 2)),
    (16, 70, 96, (64, 128, 4, 1)),
    (9, 33, 512, (32, 256, 4, 4)),
    (5, 96, 512, (64, 128, 4, 4)),
]:
    for with_bias in (False, True):
        w = torch.randn(n, k).half()
        x = torch.randn(m, k).half()
        b = torch.randn(n).half() if with_bias else None
        y = skinny_gemm(x, w, b, tile)
        ref = F.linear(x.double(), w.double(), None if b is None else b.double())
        plain.append(
            {
                "shape": [m, n, k],
                "bias": with_bias,
                "out_shape": list(y.shape),
                "out_dtype": str(y.dtype),
                "rel_err": rel_err(y, ref),
                # each row alone through the same kernel (padded rows never reach the stored ones)
                "rows_independent": bool(
                    torch.equal(y[1:2], skinny_gemm(x[1:2].repeat(2, 1), w, b, tile)[:1])
                ),
            }
        )
# a row-strided x (a view of every other row of a wider buffer) reads the right rows
wide = torch.randn(5, 2, 128).half()
w = torch.randn(40, 128).half()
strided = skinny_gemm(wide[:, 0], w, None, (32, 64, 4, 1))
strided_ok = bool(
    torch.equal(strided, skinny_gemm(wide[:, 0].contiguous(), w, None, (32, 64, 4, 1)))
)
# float32 logits: exactly `.float()` of the half-precision product
x, w = torch.randn(3, 200).half(), torch.randn(50, 200).half()
widened = bool(
    torch.equal(
        skinny_gemm(x, w, None, (32, 64, 4, 1), out_dtype=torch.float32),
        skinny_gemm(x, w, None, (32, 64, 4, 1)).float(),
    )
)
# [gate; up] with the activation in the epilogue: the values of the product followed by the
# activation kernel
gated = []
for m, n, k, tile in [(4, 74, 300, (32, 64, 4, 1)), (16, 128, 256, (32, 128, 4, 2))]:
    for with_bias in (False, True):
        w = torch.randn(n, k).half()
        x = torch.randn(m, k).half()
        b = torch.randn(n).half() if with_bias else None
        fused = skinny_gemm(x, w, b, tile, gated=True)
        two_step = silu_and_mul(skinny_gemm(x, w, b, tile))
        ref = F.linear(x.double(), w.double(), None if b is None else b.double())
        ref = F.silu(ref[:, : n // 2]) * ref[:, n // 2 :]
        gated.append(
            {
                "shape": [m, n, k],
                "out_shape": list(fused.shape),
                "same_as_two_kernels": bool(torch.equal(fused, two_step)),
                "rel_err": rel_err(fused, ref),
            }
        )
print(json.dumps({"plain": plain, "strided": strided_ok, "widened": widened, "gated": gated}))
