"""Attention backend name -> class. A new backend is a new module plus one line here.

Names only, as "module:Class" strings: the CLI reads the choices from here without importing
torch or any kernel; a backend's module is imported when it is created.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixserve.layers.attention.base import AttentionBackend, AttentionContext

BACKENDS: dict[str, str] = {
    "torch_native": "radixserve.layers.attention.torch_native_backend:TorchNativeAttnBackend",
    "triton": "radixserve.layers.attention.triton_backend:TritonAttnBackend",
    "flashinfer": "radixserve.layers.attention.flashinfer_backend:FlashInferAttnBackend",
}
# what --attention-backend accepts: a registered backend, or auto (see resolve_backend_name)
BACKEND_CHOICES: tuple[str, ...] = ("auto", *BACKENDS)
# FlashInfer's prebuilt kernels for its own version and a CUDA version (flashinfer.ai's index)
FLASHINFER_PREBUILT = "flashinfer_jit_cache"
# where FlashInfer looks for CUDA when neither CUDA_HOME nor nvcc on PATH says
DEFAULT_CUDA_HOME = "/usr/local/cuda"

logger = logging.getLogger(__name__)


def resolve_backend_name(requested: str, device: str) -> str:
    """`auto`: flashinfer on CUDA when it is importable and can have its kernels (see
    `flashinfer_kernels_problem`), else triton on CUDA; torch_native on the CPU."""
    if requested != "auto":
        if requested not in BACKENDS:
            raise ValueError(f"unknown attention backend {requested!r}; one of {BACKEND_CHOICES}")
        if device == "cpu" and requested != "torch_native":
            raise ValueError(
                f"--attention-backend {requested} needs a CUDA device; use torch_native on the CPU"
            )
        if requested == "flashinfer" and (problem := flashinfer_kernels_problem()):
            logger.warning(
                "--attention-backend flashinfer: %s; it starts only if its kernel cache "
                "already holds every kernel it needs",
                problem,
            )
        return requested
    if device == "cpu":
        return "torch_native"
    if importlib.util.find_spec("flashinfer") is None:
        return "triton"
    if problem := flashinfer_kernels_problem():
        logger.warning(
            "attention backend auto: triton, not FlashInfer: %s. Install flashinfer-jit-cache "
            "for the installed flashinfer and CUDA, or a CUDA toolkit, to use FlashInfer",
            problem,
        )
        return "triton"
    try:
        importlib.import_module("flashinfer")
    except ImportError as error:
        logger.warning("attention backend auto: triton, FlashInfer does not import: %s", error)
        return "triton"
    return "flashinfer"


def flashinfer_kernels_problem() -> str | None:
    """Why FlashInfer could not get its kernels on this machine, or None when it can.

    FlashInfer loads prebuilt kernels from the flashinfer-jit-cache package and compiles any
    other at first use with nvcc, found as FlashInfer itself finds it (FLASHINFER_NVCC; else
    CUDA_HOME or CUDA_PATH, nvcc on PATH, /usr/local/cuda). A CUDA runtime image, ours by
    default, has no nvcc: without this check `auto` picked FlashInfer there and the server
    died compiling its first kernel."""
    if importlib.util.find_spec(FLASHINFER_PREBUILT) is not None:
        return None
    nvcc = _nvcc_path()
    if nvcc is not None and os.access(nvcc, os.X_OK):
        return None
    where = nvcc or "PATH and " + DEFAULT_CUDA_HOME
    return f"its kernels are neither prebuilt (no {FLASHINFER_PREBUILT}) nor compilable (no nvcc in {where})"


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
