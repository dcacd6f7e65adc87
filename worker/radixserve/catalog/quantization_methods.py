"""Quantization method names: what `--quantization` accepts, and which checkpoint formats
(a config's `quantization_config.quant_method`) each method loads.

Names only, as "module:Class" strings, like the attention backends' registry: the CLI reads
the choices from here without importing torch; `base.resolve_quantization` imports the
chosen method's module.
"""

from __future__ import annotations

from typing import Any

# --quantization NAME -> the QuantizationConfig class that builds its layers
QUANTIZATION_METHODS: dict[str, str] = {
    "fp8": "radixserve.layers.quantization.fp8:Fp8Config",
    "mxfp4": "radixserve.layers.quantization.mxfp4:Mxfp4Config",
}
# methods that only some architectures have weights for -> those architectures
ARCHITECTURES_OF: dict[str, tuple[str, ...]] = {
    "mxfp4": ("GptOssForCausalLM",),  # its MoE experts, kept as its checkpoints store them
}
QUANTIZATION_CHOICES: tuple[str, ...] = tuple(QUANTIZATION_METHODS)

# checkpoint quant_method -> the method that serves it
CHECKPOINT_METHODS: dict[str, str] = {
    "fp8": "fp8",  # Hugging Face FineGrainedFP8: per-tensor or block-wise weight scales
    "compressed-tensors": "fp8",  # float-quantized 8-bit: per-tensor or per-channel scales
}
# checkpoint quant_method -> what is dequantized at load: the model is then served like an
# unquantized checkpoint (in the model dtype, or quantized again by --quantization)
DEQUANTIZED_AT_LOAD: dict[str, str] = {
    "mxfp4": "gpt-oss's MoE experts (MXFP4 blocks and scales)",
}


class UnsupportedQuantizationError(ValueError):
    """A quantization method (asked for, or a checkpoint's) that the worker cannot serve."""


def check_method(name: str) -> None:
    if name not in QUANTIZATION_METHODS:
        raise UnsupportedQuantizationError(
            f"unsupported quantization method {name!r}; supported: {', '.join(QUANTIZATION_CHOICES)}"
        )


def method_for_checkpoint(quant_method: str) -> str:
    if quant_method not in CHECKPOINT_METHODS:
        raise UnsupportedQuantizationError(
            f"unsupported checkpoint quantization method {quant_method!r}; supported: "
            f"{', '.join([*CHECKPOINT_METHODS, *DEQUANTIZED_AT_LOAD])}"
        )
    return CHECKPOINT_METHODS[quant_method]


def check_quantization(checkpoint: dict[str, Any] | None, requested: str | None) -> str | None:
    """The method a model is served with (None: unquantized), from its checkpoint's
    `quantization_config` (a plain dict, None if it has none) and `--quantization`; raises
    UnsupportedQuantizationError naming what is supported. Torch-free: the front end runs it on
    the raw config.json before anything loads, and `base.resolve_quantization` before building
    the method's layers."""
    if requested is not None:
        check_method(requested)
    if checkpoint is None or dequantized_at_load(checkpoint):
        return requested
    quant_method = str(checkpoint.get("quant_method", "")).lower()
    method = method_for_checkpoint(quant_method)
    if requested is not None and requested != method:
        raise UnsupportedQuantizationError(
            f"--quantization {requested} cannot serve a checkpoint quantized with "
            f"{quant_method!r} (served by --quantization {method})"
        )
    if quant_method == "compressed-tensors":
        _check_compressed_tensors(checkpoint)
    return method


def check_method_for(architecture: str, method: str | None) -> None:
    """Refuse a method that has nothing to quantize in this architecture."""
    served = ARCHITECTURES_OF.get(method or "")
    if served is not None and architecture not in served:
        raise UnsupportedQuantizationError(
            f"--quantization {method} applies to {', '.join(served)} only, not {architecture}"
        )


def dequantized_at_load(checkpoint: dict[str, Any]) -> bool:
    """Whether a checkpoint's `quantization_config` names a format the loader dequantizes
    (the model is then served as if unquantized: `--quantization` applies as to one)."""
    return str(checkpoint.get("quant_method", "")).lower() in DEQUANTIZED_AT_LOAD


def _check_compressed_tensors(qc: dict[str, Any]) -> None:
    """Accept the float-quantized 8-bit schemes: FP8 weights with tensor or channel scales
    (activations, whatever the checkpoint says, are quantized per token at run time)."""
    groups = qc.get("config_groups") or {}
    if not groups:
        raise UnsupportedQuantizationError("compressed-tensors checkpoint without config_groups")
    for name, group in groups.items():
        weights = group.get("weights") or {}
        scheme = (weights.get("num_bits"), weights.get("type"), weights.get("strategy"))
        if scheme not in ((8, "float", "tensor"), (8, "float", "channel")):
            raise UnsupportedQuantizationError(
                f"compressed-tensors group {name!r}: weights {scheme[0]}-bit {scheme[1]} with "
                f"{scheme[2]} scales are not supported; supported: 8-bit float weights with "
                "tensor or channel scales"
            )
