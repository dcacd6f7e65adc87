"""The architectures the worker serves, by a config's raw `model_type` and `architectures`:
torch- and transformers-free, so that the front end refuses a model it cannot serve before
either is imported (and the loaders check the same way)."""

from __future__ import annotations

# model_type -> the architecture (config.architectures[0]) the worker serves it as
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
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
    if served is None or (named is not None and named != served):
        what = named or f"model_type {model_type!r}"
        if named is not None:
            what = f"{named!r} (model_type {model_type!r})"
        supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES.values()))
        raise UnsupportedModelError(f"unsupported architecture {what}; supported: {supported}")
    return served
