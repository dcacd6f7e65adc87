"""Attention backend name -> class. A new backend is a new module plus one line here."""

from __future__ import annotations

import importlib

from radixserve.layers.attention.base import AttentionBackend

BACKENDS: dict[str, str] = {
    "torch_native": "radixserve.layers.attention.torch_native_backend:TorchNativeAttnBackend",
    "triton": "radixserve.layers.attention.triton_backend:TritonAttnBackend",
    "flashinfer": "radixserve.layers.attention.flashinfer_backend:FlashInferAttnBackend",
}


def resolve_backend_name(requested: str, device: str) -> str:
    """`auto`: flashinfer when importable on CUDA, else triton on CUDA, torch_native on the CPU."""
    if requested != "auto":
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


def create_attention_backend(name: str, model_runner) -> AttentionBackend:
    module_name, cls_name = BACKENDS[name].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(model_runner)
