"""Run a script or module with every Triton kernel it loads set to one L1 / shared-memory split
(CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, a percentage of the most shared memory
an SM can have).

Why: kernels that stream through a shared-memory pipeline measured slower in the step than
alone, three times: a 2-16-row GEMM faster than cuBLAS alone made every step using it slower
(small_m, 2026-12-04; skinny_gemm, 2026-12-05, about 7 us a launch); the FP8 GEMV's tiles,
pipelined through shared memory where they won, were chosen in the step because alone was not
the step (down's best tile alone took 15.5 us, in the step 19.6; 2026-12-02), and each FP8
GEMV costs 1.5-2 us more over its floor in the step than a bf16 one, which has no pipeline.
Triton gives a kernel of more than 48 KB of shared memory a shared-heavy split and the others
the driver's default; an SM changes its split only when it has drained, so a step that
alternates the two kinds of kernel may pay a drain at each change, and a dependent launch
(PDL) cannot start its programs early across one. With one split for every kernel there is no
change to pay. This is the experiment that says whether that is where the time goes; the
worker sets no split until it does.

Usage: python3 scripts/gpu/carveout.py PERCENT SCRIPT.py [ARGS...]
       python3 scripts/gpu/carveout.py PERCENT -m MODULE [ARGS...]
  e.g. python3 scripts/gpu/carveout.py 100 scripts/gpu/spec_decode_bench.py verify
       random:llama-3-8b --sizes 1,2,8 (against the same without the wrapper, in one call)
"""

from __future__ import annotations

import ctypes
import os
import runpy
import sys

import triton

CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9


def one_split_for_every_kernel(percent: int) -> list[str]:
    """From now on, every Triton kernel this process loads prefers `percent` (0-100); returns
    the list that the loaded kernels' names are appended to."""
    set_attribute = None
    loaded: list[str] = []

    def on_load(module, function, name, *rest) -> None:
        nonlocal set_attribute
        if set_attribute is None:  # libcuda only once a kernel loads: a CPU run never does
            set_attribute = ctypes.CDLL("libcuda.so.1").cuFuncSetAttribute
            set_attribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        status = set_attribute(
            function, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, percent
        )
        if status != 0:
            raise RuntimeError(f"cuFuncSetAttribute on {name}: CUresult {status}")
        loaded.append(name)

    hooks = triton.knobs.runtime.kernel_load_end_hook
    if hasattr(hooks, "add"):  # Triton's HookChain
        hooks.add(on_load)
    else:  # a Triton whose hook is one callable (or None)
        triton.knobs.runtime.kernel_load_end_hook = on_load
    return loaded


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    percent = int(sys.argv[1])
    if not 0 <= percent <= 100:
        sys.exit(f"PERCENT is 0-100, got {percent}")
    loaded = one_split_for_every_kernel(percent)
    try:
        if sys.argv[2] == "-m":
            sys.argv = sys.argv[3:]
            runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
        else:
            sys.argv = sys.argv[2:]
            sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))  # its siblings
            runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        print(
            f"carveout.py: {len(loaded)} Triton kernels loaded at {percent}% shared",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
