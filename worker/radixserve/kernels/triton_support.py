"""What every Triton kernel of the worker shares: the import guard, `jit`, the precision of
float32 dots, whether a tensor takes the kernels at all, and programmatic dependent launch.

Triton is in the `gpu` and `dev` extras, not the base install; without it this module still
imports (the torch paths never launch a kernel) and `enabled_for` is always False.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: the kernels here and in gemv/argmax never launch
    triton = tl = None


def jit(fn: Callable | None = None, **options: Any) -> Callable:
    """triton.jit (with its `options`) where Triton is installed; elsewhere the function itself,
    which is never launched. The layers' other Triton modules (gemv, argmax) use it too."""
    if fn is None:
        return functools.partial(jit, **options)
    return triton.jit(fn, **options) if triton is not None else fn


def dot_precision(dtype: torch.dtype) -> str:
    """float32 models are the exactness reference: keep their dots in IEEE float32, not tf32."""
    return "ieee" if dtype == torch.float32 else "tf32"


def enabled_for(x: torch.Tensor) -> bool:
    """Whether `x`'s layer takes the fused kernels (CUDA tensors, Triton installed); tests
    patch this to compare a model against its own torch path."""
    return x.is_cuda and triton is not None


@functools.cache
def _has_dependent_launch(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


def dependent_launch(x: torch.Tensor) -> dict[str, bool]:
    """Launch options for a kernel on x's device: on Hopper and newer it launches as a
    programmatic dependent of the kernel before it (PDL), so its programs are resident and
    waiting (`wait_for_prior_kernel`) when that kernel finishes, instead of starting only then.
    A batch-1 decode step is ~300 small kernels in a row, and the gap between two of them is a
    launch's latency each time. Every kernel launched this way must call
    `wait_for_prior_kernel` before it touches memory: that is what keeps stream order."""
    on = x.is_cuda and triton is not None and _has_dependent_launch(x.device.index or 0)
    return {"PDL": on, "launch_pdl": on}


@jit
def wait_for_prior_kernel(PDL: tl.constexpr, LAUNCH_NEXT_FIRST: tl.constexpr = False):
    """With PDL: wait until the kernel before has completed and its writes are visible, and
    let the next kernel's programs launch as soon as all of this kernel's have started: after
    the wait, or with LAUNCH_NEXT_FIRST before it.

    Nothing the kernel before writes may be touched before the wait. Reads that no kernel of
    the step writes may come first, and their latency leaves the step's critical path: the
    kernels here read two kinds that way, constants (weights, scales, cos/sin tables) and the
    step's inputs (positions, sequence lengths, KV slots, written before the step's first
    kernel). Only those: with a kernel that launches the next first, the kernel after it may
    start while the one before it still runs. tests/unit/test_dependent_launch.py checks each
    kernel's early reads against the arguments it names.

    LAUNCH_NEXT_FIRST is for a short kernel before one with early reads of its own: the
    rotary kernel (about 1 us) before the decode attention, whose programs are then resident
    and have their KV slots at hand when it ends, and the one-row LoRA shrink before its GEMV
    (kernels/lora.py). Everywhere else it measured slower (docs/benchmark-log.md, 2026-12-03
    late morning)."""
    if PDL:
        if LAUNCH_NEXT_FIRST:
            tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
        if not LAUNCH_NEXT_FIRST:
            tl.extra.cuda.gdc_launch_dependents()
