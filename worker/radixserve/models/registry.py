"""Architecture name (config.architectures[0]) -> model class, and the start-up check that a
model can be served at all."""

from __future__ import annotations

from typing import Any

from torch import nn

from radixserve.layers.quantization.base import resolve_quantization
from radixserve.model_loader.config import architecture_of
from radixserve.models.gemma2 import Gemma2ForCausalLM
from radixserve.models.gemma3 import Gemma3ForCausalLM
from radixserve.models.llama import (
    LlamaForCausalLM,
    MistralForCausalLM,
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
)
from radixserve.models.mixtral import MixtralForCausalLM
from radixserve.models.qwen3_moe import Qwen3MoeForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "Gemma2ForCausalLM": Gemma2ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
}


def get_model_class(architecture: str) -> type[nn.Module]:
    try:
        return MODEL_REGISTRY[architecture]
    except KeyError:
        supported = ", ".join(sorted(MODEL_REGISTRY))
        raise ValueError(
            f"unsupported architecture {architecture!r}; supported: {supported}"
        ) from None


def check_servable(hf_config: Any, quantization: str | None) -> None:
    """Raise a ValueError naming what cannot be served (architecture, quantization method) and
    what can: what a process runs before it starts anything else for a model."""
    get_model_class(architecture_of(hf_config))
    resolve_quantization(hf_config, quantization)
