"""Quantization method names: what `--quantization` accepts, and which checkpoint formats
(a config's `quantization_config.quant_method`) each method loads.

Names only, as "module:Class" strings, like the attention backends' registry: the CLI reads
the choices from here without importing torch; `base.resolve_quantization` imports the
chosen method's module.
"""

from __future__ import annotations

# --quantization NAME -> the QuantizationConfig class that builds its layers
QUANTIZATION_METHODS: dict[str, str] = {
    "fp8": "radixserve.layers.quantization.fp8:Fp8Config",
}
QUANTIZATION_CHOICES: tuple[str, ...] = tuple(QUANTIZATION_METHODS)

# checkpoint quant_method -> the method that serves it
CHECKPOINT_METHODS: dict[str, str] = {
    "fp8": "fp8",  # Hugging Face FineGrainedFP8: per-tensor or block-wise weight scales
    "compressed-tensors": "fp8",  # float-quantized 8-bit: per-tensor or per-channel scales
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
            f"{', '.join(CHECKPOINT_METHODS)}"
        )
    return CHECKPOINT_METHODS[quant_method]
