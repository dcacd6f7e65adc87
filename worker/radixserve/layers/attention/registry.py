"""Attention backend name -> class. A new backend is a new module plus one line here.

Names only, as "module:Class" strings: the CLI reads the choices from here without importing
torch or any kernel; a backend's module is imported when it is created.
"""

from __future__ import annotations

import importlib
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


def resolve_backend_name(requested: str, device: str) -> str:
    """`auto`: flashinfer when importable on CUDA, else triton on CUDA, torch_native on the CPU."""
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
    try:
        importlib.import_module("flashinfer")
        return "flashinfer"
    except ImportError:
        return "triton"


def create_attention_backend(name: str, context: AttentionContext) -> AttentionBackend:
    module_name, cls_name = BACKENDS[name].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(context)
