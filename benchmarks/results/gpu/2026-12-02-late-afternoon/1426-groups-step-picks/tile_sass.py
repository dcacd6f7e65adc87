"""One-off: SASS a weight, spills and local-memory ops of the GEMV loop per tile, both FP8 maths."""
import collections, re, subprocess, sys, tempfile
sys.path.insert(0, "scripts/gpu")
import triton
from triton.compiler import ASTSource
import gemv_sass as gs
from radixserve.layers import gemv

TILES = [(8, 512, 2, 4), (8, 1024, 2, 3), (8, 1024, 4, 3), (16, 512, 2, 4), (16, 1024, 2, 3),
         (16, 1024, 4, 3), (8, 2048, 2, 2), (32, 512, 2, 4), (16, 2048, 4, 2)]
print("triton", triton.__version__)
for gated in (False, True):
    for tile in TILES:
        rows, chunk, warps, stages = tile
        r = max(1, rows // 2) if gated else rows
        for groups in (True,):
            ce = {"HAS_BIAS": False, "HAS_SCALE": True, "GATED": gated, "F16_GROUPS": groups,
                  "BLOCK_N": r, "BLOCK_K": chunk, "NUM_STAGES": stages, "PDL": True}
            ptr = {"W": "fp8e4nv", "Bias": "fp8e4nv", "Scale": "fp32"}
            if groups:
                ptr.update(X="i32", W="i32")
            sig = {a: "constexpr" if a in ce else ("i32" if a in ("N", "K", "stride_wn") else "*" + ptr.get(a, "bf16")) for a in gemv._gemv_kernel.arg_names}
            attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(gemv._gemv_kernel.arg_names) if sig[a] != "constexpr"}
            try:
                c = triton.compile(ASTSource(fn=gemv._gemv_kernel, signature=sig, constexprs=ce, attrs=attrs), target=gs.HOPPER, options={"num_warps": warps})
            except Exception as e:
                print(f"gated={gated} {tile} groups={groups}: FAILED {str(e)[:100]}")
                continue
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(c.asm["cubin"]); f.flush()
                sass = subprocess.run([str(gs.NVDISASM), "-c", f.name], capture_output=True, text=True, check=True).stdout
            try:
                c._init_handles()
            except Exception:
                pass
            ops = collections.Counter(gs.OPCODE.findall("\n".join(gs.loop_body(sass))))
            allops = collections.Counter(gs.OPCODE.findall(sass))
            wpt = rows * chunk / (32 * warps)
            local = sum(v for k, v in allops.items() if k.startswith(("LDL", "STL")))
            regs = re.search(r"\.maxntid|REG:(\d+)", sass)
            print(f"gated={gated!s:5} {tile!s:18} groups={groups!s:5}: {sum(ops.values()) / wpt:5.2f}/w "
                  f"loop {sum(ops.values())} total {sum(allops.values())} local {local} "
                  f"smem {c.metadata.shared} regs {getattr(c, 'n_regs', '?')} spills {getattr(c, 'n_spills', '?')} "
                  f"{[k for k in ops if k.startswith(('BAR', 'LDL', 'STL', 'LDG', 'LDS', 'LDSM', 'SHFL'))]}", flush=True)
