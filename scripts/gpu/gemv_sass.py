"""Instructions a weight in the batch-1 GEMV's inner loop, from its Hopper (sm_90) SASS, for the
Llama-3-8B projections at the tiles `kernels/gemv.block_config` ships, with each compile's
registers, stack and shared memory. Runs without a GPU: Triton compiles for sm_90 with its bundled ptxas and
disassembles with its bundled nvdisasm (resources: its cuobjdump). The
integer arguments and pointers are specialized as divisible by 16, as a launch on those shapes
specializes them (without that the loads do not vectorize and the count means nothing).

A count is not a time (docs/benchmark-log.md, 2026-12-02: a loop cut from 4.9 to 3.8 instructions
a weight ran slower); it says what a kernel change did to the code the GPU runs.

Usage: python3 scripts/gpu/gemv_sass.py   (a line per projection and weight type)
"""

from __future__ import annotations

import collections
import re
import subprocess
import tempfile
from pathlib import Path

import triton
import triton.backends.nvidia
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from radixserve.kernels import gemv

HOPPER = GPUTarget("cuda", 90, 32)
BIN = Path(triton.backends.nvidia.__file__).parent / "bin"  # its bundled nvdisasm, cuobjdump
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
OPCODE = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", re.M)


def loop_body(sass: str) -> list[str]:
    """The longest backward branch's body: the K loop."""
    lines, body = sass.splitlines(), []
    for end, line in enumerate(lines):
        if target := re.search(r"BRA `\((\.L_x_\d+)\)", line):
            starts = [i for i, s in enumerate(lines[:end]) if s.strip() == target[1] + ":"]
            if starts and end - starts[0] > len(body):
                body = lines[starts[0] : end + 1]
    return body


def compile_sass(kernel, constexprs: dict, warps: int, weight_type: str) -> tuple[str, str]:
    """The kernel's Hopper SASS and its resource line (registers, stack) for these constants;
    pointers bf16 but for W (`weight_type`) and Scale, integers i32, every non-constant
    argument specialized divisible by 16."""
    pointers = {"W": weight_type, "Scale": "fp32", "LoraSlot": "i32"}
    scalars = {"N", "K", "lora_rank", "lora_sub1", "lora_sub2"}
    signature = {
        arg: "constexpr"
        if arg in constexprs
        else (
            "i32" if arg in scalars or arg.startswith("stride") else "*" + pointers.get(arg, "bf16")
        )
        for arg in kernel.arg_names
    }
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, arg in enumerate(kernel.arg_names)
        if signature[arg] != "constexpr"
    }
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=HOPPER, options={"num_warps": warps})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        sass = subprocess.run(
            [str(BIN / "nvdisasm"), "-c", cubin.name], capture_output=True, text=True, check=True
        ).stdout
        usage = subprocess.run(
            [str(BIN / "cuobjdump"), "-res-usage", cubin.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    resources = re.search(r"REG:\d+ STACK:\d+ SHARED:\d+", usage)
    return sass, resources[0] if resources else "?"


def loop_count(weight_type: str, n: int, k: int, fp8: bool, gated: bool) -> tuple[float, str, list]:
    """Issued instructions a weight element in the K loop, the resources, the top opcodes: the
    GEMV at `block_config`'s tile."""
    columns, chunk, warps, stages = gemv.block_config(n, k, fp8=fp8)
    if gated:
        columns = max(1, columns // 2)  # as gemv() launches the gated product
    constexprs = {
        "HAS_BIAS": False,
        "HAS_SCALE": fp8,
        "GATED": gated,
        "PDL": True,
        "LORA": False,
        "LORA_BLOCK_R": 16,
        "BLOCK_N": columns,
        "BLOCK_K": chunk,
        "NUM_STAGES": stages,
    }
    sass, resources = compile_sass(gemv._gemv_kernel, constexprs, warps, weight_type)
    opcodes = collections.Counter(OPCODE.findall("\n".join(loop_body(sass))))
    weights_per_thread = columns * (2 if gated else 1) * chunk / (32 * warps)
    return sum(opcodes.values()) / weights_per_thread, resources, opcodes.most_common(6)


def main() -> None:
    for name, (n, k) in SHAPES.items():
        gated = name == "gate_up"
        for weight_type, fp8 in (("bf16", False), ("fp8e4nv", True)):
            per_weight, resources, top = loop_count(weight_type, n, k, fp8, gated)
            print(f"{name:8s} {weight_type:8s}: {per_weight:.2f} a weight, {resources}  {top}")


if __name__ == "__main__":
    main()
