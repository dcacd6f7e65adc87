"""Which attention backend a start takes (`auto` resolved against the device and what FlashInfer
has built), and creating it from its name in `radixserve.catalog.attention_backends`."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from radixserve.catalog.attention_backends import BACKEND_CHOICES, BACKENDS

if TYPE_CHECKING:
    from radixserve.layers.attention.base import AttentionBackend, AttentionContext

# FlashInfer's prebuilt kernels for its own version and a CUDA version (flashinfer.ai's index)
FLASHINFER_PREBUILT = "flashinfer_jit_cache"
# where FlashInfer looks for CUDA when neither CUDA_HOME nor nvcc on PATH says
DEFAULT_CUDA_HOME = "/usr/local/cuda"

logger = logging.getLogger(__name__)


def resolve_backend_name(requested: str, device: str, context: AttentionContext) -> str:
    """`auto`: flashinfer on CUDA when it imports and every module it needs for this model
    (`context`) is already built; else triton on CUDA, and where FlashInfer could build them
    (see `flashinfer_compiler_problem`) a background process does, for the next start: one,
    started by tensor-parallel rank 0 for all ranks (their modules are the same, and builds
    side by side in one cache clobber each other's dependency log). torch_native on the CPU.
    A named backend stands as asked (FlashInfer's own start then builds what it lacks, or
    fails in one line)."""
    if requested != "auto":
        if requested not in BACKENDS:
            raise ValueError(f"unknown attention backend {requested!r}; one of {BACKEND_CHOICES}")
        if device == "cpu" and requested != "torch_native":
            raise ValueError(
                f"--attention-backend {requested} needs a CUDA device; use torch_native on the CPU"
            )
        return requested
    if device == "cpu":
        return "torch_native"
    if importlib.util.find_spec("flashinfer") is None:
        return "triton"
    try:
        importlib.import_module("flashinfer")
    except ImportError as error:
        logger.warning("attention backend auto: triton, FlashInfer does not import: %s", error)
        return "triton"
    todo = missing_flashinfer_modules(context)
    if not todo:
        return "flashinfer"
    from radixserve.distributed.parallel_state import tp_rank  # torch: not for the CLI's import

    if tp_rank() != 0:
        return "triton"  # rank 0 says why, and builds for every rank
    if problem := flashinfer_compiler_problem():
        logger.warning(
            "attention backend auto: triton, not FlashInfer, whose modules for this model "
            "(%s) %s. Install flashinfer-jit-cache for the installed flashinfer and CUDA, or a "
            "CUDA toolkit, to use FlashInfer",
            ", ".join(todo),
            problem,
        )
        return "triton"
    start_flashinfer_build(context)
    logger.info(
        "attention backend auto: triton for this start. FlashInfer's modules for this model "
        "are not built yet (%s); a background process builds them into its cache "
        "(FLASHINFER_WORKSPACE_BASE), and the next start with that cache uses FlashInfer",
        ", ".join(todo),
    )
    return "triton"


def library_to_import_early(requested: str, device: str) -> str | None:
    """The kernel library the backend this start may take imports (FlashInfer, where installed,
    for auto and flashinfer on CUDA), for the scheduler process to import on a thread while the
    model is set up: `import flashinfer` is a few hundred milliseconds of Python modules and
    shared libraries, on the start's critical path when `resolve_backend_name` imports it."""
    if device != "cuda" or requested not in ("auto", "flashinfer"):
        return None
    return "flashinfer" if importlib.util.find_spec("flashinfer") is not None else None


def missing_flashinfer_modules(context: AttentionContext) -> list[str]:
    """Names of the FlashInfer modules this model needs that are neither prebuilt nor in
    FlashInfer's JIT cache."""
    from radixserve.layers.attention import flashinfer_kernels

    specs = flashinfer_kernels.KernelSignature.of(context).specs()
    return [spec.name for spec in flashinfer_kernels.missing(specs)]


def start_flashinfer_build(context: AttentionContext) -> None:
    """Build this model's FlashInfer modules in a background process (see flashinfer_kernels)."""
    from radixserve.layers.attention import flashinfer_kernels

    flashinfer_kernels.build_in_background(flashinfer_kernels.KernelSignature.of(context))


def flashinfer_compiler_problem() -> str | None:
    """Why FlashInfer could not compile a module on this machine, or None when it can.

    FlashInfer compiles with nvcc, found as FlashInfer itself finds it (FLASHINFER_NVCC; else
    CUDA_HOME or CUDA_PATH, nvcc on PATH, /usr/local/cuda). A CUDA runtime image, ours by
    default, has none: there only modules prebuilt (flashinfer-jit-cache) or already in the
    JIT cache can load."""
    nvcc = _nvcc_path()
    if nvcc is not None and os.access(nvcc, os.X_OK):
        return None
    where = nvcc or "PATH and " + DEFAULT_CUDA_HOME
    return (
        f"they are neither prebuilt ({FLASHINFER_PREBUILT}) nor in its cache, and no nvcc "
        f"in {where} can compile them"
    )


def _nvcc_path() -> str | None:
    if explicit := os.environ.get("FLASHINFER_NVCC"):
        return shutil.which(explicit) or explicit
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        return str(Path(cuda_home) / "bin" / "nvcc")
    on_path = shutil.which("nvcc")
    if on_path:
        return on_path
    default = Path(DEFAULT_CUDA_HOME) / "bin" / "nvcc"
    return str(default) if default.exists() else None


def create_attention_backend(name: str, context: AttentionContext) -> AttentionBackend:
    module_name, cls_name = BACKENDS[name].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(context)
