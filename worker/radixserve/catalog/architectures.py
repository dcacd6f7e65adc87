"""The architectures the worker serves, by a config's raw `model_type` and `architectures`:
torch- and transformers-free, so that the front end refuses a model it cannot serve before
either is imported (and the loaders check the same way). The one list of them:
`models/registry.py` imports a model's module by the name given here when it is asked for
the class. A new architecture is its model file plus one line in `MODEL_CLASSES`.
"""

from __future__ import annotations

import re

# model_type -> the model class it is served with, as "module:Class"; the class's name is the
# architecture (config.architectures[0]) a config of that model_type is served as
MODEL_CLASSES: dict[str, str] = {
    "llama": "radixserve.models.llama:LlamaForCausalLM",
    "mistral": "radixserve.models.llama:MistralForCausalLM",
    "qwen2": "radixserve.models.llama:Qwen2ForCausalLM",
    "qwen3": "radixserve.models.llama:Qwen3ForCausalLM",
    "qwen3_moe": "radixserve.models.qwen3_moe:Qwen3MoeForCausalLM",
    "mixtral": "radixserve.models.mixtral:MixtralForCausalLM",
    "gemma2": "radixserve.models.gemma2:Gemma2ForCausalLM",
    "gemma3_text": "radixserve.models.gemma3:Gemma3ForCausalLM",
    "gpt_oss": "radixserve.models.gpt_oss:GptOssForCausalLM",
    "deepseek_v2": "radixserve.models.deepseek_v2:DeepseekV2ForCausalLM",
    "deepseek_v3": "radixserve.models.deepseek_v2:DeepseekV3ForCausalLM",
}
# architecture -> its model class, as "module:Class"
CLASS_BY_ARCHITECTURE: dict[str, str] = {
    path.rpartition(":")[2]: path for path in MODEL_CLASSES.values()
}
# model_type -> the architecture the worker serves it as
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    model_type: path.rpartition(":")[2] for model_type, path in MODEL_CLASSES.items()
}


class UnsupportedModelError(ValueError):
    """A model of an architecture the worker does not serve."""


def check_architecture(model_type: str | None, architectures: list[str] | None = None) -> str:
    """The architecture a config (its raw `model_type` and `architectures`) is served as, or
    UnsupportedModelError naming it and listing what is served. Run on the raw config.json,
    before transformers parses it, so a model transformers knows but we do not (or neither
    does) fails the same one-line way."""
    named = (architectures or [None])[0]
    served = SUPPORTED_ARCHITECTURES.get(model_type or "")
    # a reranker's classifier, or an embedder saved without its LM head
    # (catalog/model_tasks.py): served as the causal LM's body with a pooling head
    body = re.sub("(ForSequenceClassification|Model)$", "ForCausalLM", named or "")
    if served is None or (named is not None and body != served):
        what = named or f"model_type {model_type!r}"
        if named is not None:
            what = f"{named!r} (model_type {model_type!r})"
        supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES.values()))
        raise UnsupportedModelError(f"unsupported architecture {what}; supported: {supported}")
    return served
