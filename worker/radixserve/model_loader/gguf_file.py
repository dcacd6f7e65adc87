"""Read a llama.cpp GGUF file as an HF config plus HF-named float tensors.

The metadata becomes a transformers config; every tensor is dequantized with `gguf`'s own
kernels (whatever quantization it supports), renamed to the HF parameter name and, for the
llama architecture, has llama.cpp's rotary permutation of the Q and K rows undone, so the result
is what `AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)` would hold.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import CONFIG_MAPPING

from radixserve.model_loader.config import as_id_set
from radixserve.model_loader.conversion_cache import converted_once

logger = logging.getLogger(__name__)

# GGUF `general.architecture` -> HF `model_type` (a llama-architecture file named "mistral" is
# a Mistral model: llama.cpp stores both the same way).
_MODEL_TYPE_BY_GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

_GLOBAL_TENSOR_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_TENSOR_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_GLOBAL_TENSOR = re.compile(r"^(\w+)\.(weight|bias)$")
# llama.cpp stores Llama 3.1+ rope scaling as per-frequency divisors; HF spells it as parameters.
_ROPE_FREQS_TENSOR = "rope_freqs.weight"
_LLAMA3_LOW_FREQ_FACTOR = 1.0
_LLAMA3_HIGH_FREQ_FACTOR = 4.0
_LLAMA3_ORIGINAL_CONTEXT = 8192


def hf_tensor_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    if match := _BLOCK_TENSOR.match(gguf_name):
        layer, kind, suffix = match.groups()
        if kind in _BLOCK_TENSOR_NAMES:
            return f"model.layers.{layer}.{_BLOCK_TENSOR_NAMES[kind]}.{suffix}"
    elif (match := _GLOBAL_TENSOR.match(gguf_name)) and match.group(1) in _GLOBAL_TENSOR_NAMES:
        return f"{_GLOBAL_TENSOR_NAMES[match.group(1)]}.{match.group(2)}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face counterpart")


def unpermute_rotary(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's `permute` of Q/K rows (it interleaves each head's two rotary halves)."""
    half_dim = weight.shape[0] // num_heads // 2
    rows = weight.reshape(num_heads, half_dim, 2, *weight.shape[1:])
    return rows.swapaxes(1, 2).reshape(weight.shape)


class GGUFFile:
    """One GGUF file: its metadata as an HF config and its tensors as HF-named torch tensors."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reader = gguf.GGUFReader(path)
        self.gguf_arch = self._field("general.architecture")
        if self.gguf_arch not in _MODEL_TYPE_BY_GGUF_ARCH:
            supported = ", ".join(sorted(_MODEL_TYPE_BY_GGUF_ARCH))
            raise ValueError(
                f"{path}: GGUF architecture {self.gguf_arch!r} is not supported ({supported})"
            )
        self.tensor_names = {t.name for t in self.reader.tensors}
        self.hf_config = self._build_hf_config()

    def _field(self, key: str, default: Any = None) -> Any:
        field = self.reader.get_field(key)
        return default if field is None else field.contents()

    def _arch_field(self, key: str, default: Any = None) -> Any:
        return self._field(f"{self.gguf_arch}.{key}", default)

    @property
    def chat_template(self) -> str | None:
        return self._field("tokenizer.chat_template")

    @property
    def eos_token_ids(self) -> set[int]:
        """End-of-sequence, end-of-turn and end-of-message ids: each one ends a generation."""
        keys = ("eos_token_id", "eot_token_id", "eom_token_id")
        return set().union(*(as_id_set(self._field(f"tokenizer.ggml.{k}")) for k in keys))

    def _model_type(self) -> str:
        name = str(self._field("general.name", "")).lower()
        if self.gguf_arch == "llama" and "mistral" in name:
            return "mistral"
        return _MODEL_TYPE_BY_GGUF_ARCH[self.gguf_arch]

    def _build_hf_config(self) -> transformers.PretrainedConfig:
        num_heads = int(self._arch_field("attention.head_count"))
        hidden_size = int(self._arch_field("embedding_length"))
        vocab_size = self._arch_field("vocab_size") or len(self._field("tokenizer.ggml.tokens"))
        model_type = self._model_type()
        kwargs: dict[str, Any] = {
            "vocab_size": int(vocab_size),
            "hidden_size": hidden_size,
            "intermediate_size": int(self._arch_field("feed_forward_length")),
            "num_hidden_layers": int(self._arch_field("block_count")),
            "num_attention_heads": num_heads,
            "num_key_value_heads": int(self._arch_field("attention.head_count_kv", num_heads)),
            "head_dim": int(self._arch_field("attention.key_length", hidden_size // num_heads)),
            "max_position_embeddings": int(self._arch_field("context_length")),
            "rms_norm_eps": float(self._arch_field("attention.layer_norm_rms_epsilon")),
            "rope_theta": float(self._arch_field("rope.freq_base", 10000.0)),
            "tie_word_embeddings": "output.weight" not in self.tensor_names,
            "bos_token_id": self._field("tokenizer.ggml.bos_token_id"),
            "eos_token_id": self._field("tokenizer.ggml.eos_token_id"),
        }
        if model_type == "llama":
            kwargs["attention_bias"] = "blk.0.attn_q.bias" in self.tensor_names
        if model_type == "mistral":
            kwargs["sliding_window"] = None
        rope_scaling = self._rope_scaling(kwargs["rope_theta"], kwargs["head_dim"])
        if rope_scaling is not None:
            kwargs["rope_scaling"] = rope_scaling
        return CONFIG_MAPPING[model_type](**kwargs)

    def _rope_scaling(self, rope_theta: float, head_dim: int) -> dict[str, Any] | None:
        """Rope scaling from `rope.scaling.*` metadata, or recovered from a `rope_freqs` tensor."""
        scaling_type = self._arch_field("rope.scaling.type")
        if scaling_type in ("linear", "yarn"):
            params: dict[str, Any] = {
                "rope_type": scaling_type,
                "factor": float(self._arch_field("rope.scaling.factor")),
            }
            original = self._arch_field("rope.scaling.original_context_length")
            if original:
                params["original_max_position_embeddings"] = int(original)
            return params
        if scaling_type not in (None, "none"):
            raise ValueError(f"{self.path}: rope scaling {scaling_type!r} is not supported")
        if _ROPE_FREQS_TENSOR in self.tensor_names:
            return self._llama3_scaling_from_rope_freqs(rope_theta, head_dim)
        return None

    def _llama3_scaling_from_rope_freqs(self, rope_theta: float, head_dim: int) -> dict[str, Any]:
        """llama.cpp turns Llama 3.1+'s `llama3` rope parameters into per-frequency divisors.
        Recover the parameters (Meta used the same low/high factors and original context for
        every release; only `factor` varies) and check they reproduce the stored divisors."""
        tensor = next(t for t in self.reader.tensors if t.name == _ROPE_FREQS_TENSOR)
        stored = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(-1)
        params = {
            "rope_type": "llama3",
            "factor": float(stored.max()),
            "low_freq_factor": _LLAMA3_LOW_FREQ_FACTOR,
            "high_freq_factor": _LLAMA3_HIGH_FREQ_FACTOR,
            "original_max_position_embeddings": _LLAMA3_ORIGINAL_CONTEXT,
        }
        if not np.allclose(llama3_frequency_divisors(rope_theta, head_dim, params), stored, 1e-3):
            raise ValueError(f"{self.path}: rope_freqs does not match any llama3 rope scaling")
        return params

    def weights(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        """Dequantize tensor by tensor (only one float copy alive at a time beyond the consumer's)."""
        config = self.hf_config
        for tensor in self.reader.tensors:
            if tensor.name == _ROPE_FREQS_TENSOR:
                continue  # folded into the config's rope_scaling
            name = hf_tensor_name(tensor.name)
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            if self.gguf_arch == "llama" and ".attn_q." in tensor.name:
                values = unpermute_rotary(values, config.num_attention_heads)
            elif self.gguf_arch == "llama" and ".attn_k." in tensor.name:
                values = unpermute_rotary(values, config.num_key_value_heads)
            yield name, torch.from_numpy(np.array(values, dtype=np.float32)).to(dtype)


def llama3_frequency_divisors(
    rope_theta: float, head_dim: int, params: dict[str, Any]
) -> np.ndarray:
    """What llama.cpp's converter stores as `rope_freqs` for the given `llama3` parameters."""
    inv_freq = 1.0 / rope_theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    original = params["original_max_position_embeddings"]
    smooth = (original / wavelen - low) / (high - low)
    return np.where(
        wavelen < original / high,
        1.0,
        np.where(wavelen > original / low, factor, 1.0 / ((1 - smooth) / factor + smooth)),
    )


# Dequantizing costs seconds at every start (the bundled model's parse and dequantization: about
# 8 s on a 2-core machine), so small GGUF files are dequantized once, into an HF checkpoint in
# the cache; a bigger one would cost too much disk (float32 is about 7 times a Q4 file).
DEQUANTIZED_CACHE_MAX_FILE_BYTES = 512 << 20
DEQUANTIZED_FORMAT = "1"  # bump when the conversion changes


def dequantized_checkpoint(path: Path) -> Path | None:
    """The GGUF file as a float32 Hugging Face checkpoint directory (config.json,
    generation_config.json with its stop ids, model.safetensors) in the cache, converted on
    first use; None when the file is too big to keep dequantized or the cache is read-only."""
    if path.stat().st_size > DEQUANTIZED_CACHE_MAX_FILE_BYTES:
        return None
    return converted_once(
        "dequantized",
        path,
        DEQUANTIZED_FORMAT,
        write=lambda staging: _write_checkpoint(GGUFFile(path), staging),
        complete=lambda d: (d / "model.safetensors").is_file(),
        what=f"the weights of {path.name}",
    )


def _write_checkpoint(gguf_file: GGUFFile, directory: Path) -> None:
    gguf_file.hf_config.save_pretrained(directory)
    eos = sorted(gguf_file.eos_token_ids)
    if eos:
        transformers.GenerationConfig(eos_token_id=eos).save_pretrained(directory)
    save_file(dict(gguf_file.weights(torch.float32)), str(directory / "model.safetensors"))
