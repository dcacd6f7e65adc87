"""One-off (run from the repository root with the f16-groups patch applied): SASS a weight,
registers and spills of the GEMV's K loop per tile, f16 groups (reformatted after the run)."""

import collections
import contextlib
import subprocess
import sys
import tempfile

sys.path.insert(0, "scripts/gpu")
import gemv_sass as gs  # noqa: E402
import triton  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from radixserve.layers import gemv  # noqa: E402

TILES = [
    (8, 512, 2, 4),
    (8, 1024, 2, 3),
    (8, 1024, 4, 3),
    (16, 512, 2, 4),
    (16, 1024, 2, 3),
    (16, 1024, 4, 3),
    (8, 2048, 2, 2),
    (32, 512, 2, 4),
    (16, 2048, 4, 2),
]
KERNEL = gemv._gemv_kernel
print("triton", triton.__version__)
for gated in (False, True):
    for tile in TILES:
        rows, chunk, warps, stages = tile
        constexprs = {
            "HAS_BIAS": False,
            "HAS_SCALE": True,
            "GATED": gated,
            "F16_GROUPS": True,
            "BLOCK_N": max(1, rows // 2) if gated else rows,
            "BLOCK_K": chunk,
            "NUM_STAGES": stages,
            "PDL": True,
        }
        pointers = {"X": "i32", "W": "i32", "Bias": "fp8e4nv", "Scale": "fp32"}
        signature = {
            a: "constexpr"
            if a in constexprs
            else ("i32" if a in ("N", "K", "stride_wn") else "*" + pointers.get(a, "bf16"))
            for a in KERNEL.arg_names
        }
        attrs = {
            (i,): [["tt.divisibility", 16]]
            for i, a in enumerate(KERNEL.arg_names)
            if signature[a] != "constexpr"
        }
        source = ASTSource(fn=KERNEL, signature=signature, constexprs=constexprs, attrs=attrs)
        compiled = triton.compile(source, target=gs.HOPPER, options={"num_warps": warps})
        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            cubin.write(compiled.asm["cubin"])
            cubin.flush()
            sass = subprocess.run(
                [str(gs.NVDISASM), "-c", cubin.name], capture_output=True, text=True, check=True
            ).stdout
        with contextlib.suppress(Exception):  # registers and spills need a GPU
            compiled._init_handles()
        loop = collections.Counter(gs.OPCODE.findall("\n".join(gs.loop_body(sass))))
        every = collections.Counter(gs.OPCODE.findall(sass))
        local = sum(v for k, v in every.items() if k.startswith(("LDL", "STL")))
        loads = [k for k in loop if k.startswith(("BAR", "LDL", "STL", "LDG", "LDS", "SHFL"))]
        print(
            f"gated={gated!s:5} {tile!s:18} groups=True : "
            f"{sum(loop.values()) / (rows * chunk / (32 * warps)):5.2f}/w "
            f"loop {sum(loop.values())} total {sum(every.values())} local {local} "
            f"smem {compiled.metadata.shared} regs {getattr(compiled, 'n_regs', '?')} "
            f"spills {getattr(compiled, 'n_spills', '?')} {loads}",
            flush=True,
        )
