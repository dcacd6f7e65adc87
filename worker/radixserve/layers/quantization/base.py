"""The interface a quantization method implements, and the choice of method for a model.

A method decides how a linear layer stores and multiplies its weight (`linear`), how MoE
experts store theirs (`quantize_experts`), and how a pre-quantized checkpoint's tensors reach
those layers (`adapt_checkpoint`). Models build their projections through `make_linear`, so a
model file never names a method.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from radixserve.catalog.quantization_methods import (
    QUANTIZATION_METHODS,
    check_quantization,
    dequantized_at_load,
)
from radixserve.layers.linear import Linear

WeightStream = Iterator[tuple[str, torch.Tensor]]


class QuantizationConfig(ABC):
    name: str
    # whether MoE experts stay in MXFP4 (gpt-oss's checkpoint format, `--quantization mxfp4`)
    keeps_experts_mxfp4: bool = False

    @abstractmethod
    def linear(self, in_features: int, out_features: int, bias: bool) -> nn.Module:
        """A projection that stores its weight this method's way and loads `load_rows`."""

    @property
    def quantize_experts(self) -> bool:
        """Whether MoE expert weights are stored quantized (FP8 with channel scales)."""
        return False

    def adapt_checkpoint(self, weights: WeightStream) -> WeightStream:
        """The checkpoint's tensors as the layers load them (e.g. block scales folded in)."""
        return weights

    def load_working_bytes(self, model: nn.Module) -> int:
        """Device bytes the load works in beside the read's own buffers (quantizing at load),
        so that the model runner knows whether the read fits after the KV pool."""
        return 0

    def describe(self) -> str:
        return self.name


def checkpoint_quantization(hf_config: Any) -> dict[str, Any] | None:
    """The config's `quantization_config` as a plain dict (transformers keeps it a dict or,
    after its own parsing, an object with `to_dict`)."""
    qc = getattr(hf_config, "quantization_config", None)
    if qc is None:
        return None
    return dict(qc) if isinstance(qc, dict) else qc.to_dict()


def _method_class(name: str) -> type[QuantizationConfig]:
    module_name, cls_name = QUANTIZATION_METHODS[name].split(":")
    return getattr(importlib.import_module(module_name), cls_name)


def resolve_quantization(hf_config: Any, requested: str | None) -> QuantizationConfig | None:
    """The method a model is served with: the checkpoint's own when it is quantized (and
    `--quantization` names the same method or nothing), else `--quantization`'s, applied
    at load time, else None (a checkpoint the loader dequantizes, MXFP4 experts, counts as
    unquantized). Raises UnsupportedQuantizationError naming what is supported."""
    checkpoint = checkpoint_quantization(hf_config)
    method = check_quantization(checkpoint, requested)
    if method is None:
        return None
    if checkpoint is None or dequantized_at_load(checkpoint):
        return _method_class(method).at_load()
    return _method_class(method).from_checkpoint(checkpoint)


def make_linear(
    in_features: int, out_features: int, bias: bool, quant: QuantizationConfig | None
) -> nn.Module:
    """A model's projection: the plain (GEMV-backed) Linear, or the method's quantized one."""
    if quant is None:
        return Linear(in_features, out_features, bias=bias)
    return quant.linear(in_features, out_features, bias)
