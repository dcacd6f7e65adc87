"""The model's shape and serving parameters, resolved once at load time.

Every loader (HF directory, GGUF file, random init) ends in a `transformers` config; this module
turns that config plus the CLI's `--dtype`/`--device`/`--context-length` into the flat
`ModelConfig` the model runner, the memory pools and the scheduler read. Keeping the resolution
here means the rest of the worker never has to know which transformers version spells a field
which way (e.g. `rope_parameters` in v5 versus `rope_theta`/`rope_scaling` in v4).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import transformers

from radixserve.catalog.architectures import check_architecture

NO_WINDOW = -1


_DTYPES_BY_NAME: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}
_HALF_PRECISION = (torch.bfloat16, torch.float16)


@dataclass
class ModelConfig:
    """What the serving stack needs to know about a model, independent of where it came from."""

    hf_config: transformers.PretrainedConfig
    architecture: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    context_len: int
    eos_token_ids: set[int]
    dtype: torch.dtype
    intermediate_size: int = 0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # The rope scaling parameters without `rope_theta`; None for plain RoPE.
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    # per layer: the sliding window (NO_WINDOW for full attention)
    sliding_windows: tuple[int, ...] = ()
    # mixture of experts: experts per MoE layer, experts per token, one expert's width
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0

    @property
    def matmul_parameters(self) -> int:
        """Parameters that do matmul work per token (the embedding lookup does none): a token
        costs 2 x this many FLOPs besides attention, the figure every MFU here is based on.
        MoE layers count their router and the experts a token is sent to (active parameters),
        shared experts included (DeepSeek); MLA its projections, kv_b_proj's expansion too."""
        h, q = self.hidden_size, self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        attention = _mla_parameters(self.hf_config) or h * (q + 2 * kv) + q * h
        shared = getattr(self.hf_config, "n_shared_experts", 0) or 0
        total = self.vocab_size * h
        for layer in range(self.num_hidden_layers):
            if is_moe_layer(self.hf_config, layer):
                mlp = h * self.num_experts + (self.num_experts_per_tok + shared) * 3 * h * (
                    self.moe_intermediate_size
                )
            else:
                mlp = 3 * h * self.intermediate_size
            total += attention + mlp
        return total


def resolve_device(device: str) -> str:
    """Map `auto` to the device this process will actually run on."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def checkpoint_dtype(hf_config: transformers.PretrainedConfig) -> torch.dtype | None:
    """The dtype the checkpoint was saved in (`dtype` in transformers v5, `torch_dtype` in v4)."""
    value = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(value, str):
        return _DTYPES_BY_NAME.get(value)
    return value if isinstance(value, torch.dtype) else None


def resolve_dtype(
    dtype: str, device: str, hf_config: transformers.PretrainedConfig | None = None
) -> torch.dtype:
    """Resolve `--dtype`: `auto` is float32 on the CPU (bf16 matmuls are slow there) and on CUDA
    the checkpoint's own half precision, or bfloat16 when the checkpoint is float32."""
    if dtype != "auto":
        if dtype not in _DTYPES_BY_NAME:
            raise ValueError(
                f"unknown dtype {dtype!r}; expected auto, float32, bfloat16 or float16"
            )
        return _DTYPES_BY_NAME[dtype]
    if not resolve_device(device).startswith("cuda"):
        return torch.float32
    saved = checkpoint_dtype(hf_config) if hf_config is not None else None
    return saved if saved in _HALF_PRECISION else torch.bfloat16


def architecture_of(hf_config: transformers.PretrainedConfig) -> str:
    """The `*ForCausalLM` class name, checked against the model families the worker serves."""
    return check_architecture(
        getattr(hf_config, "model_type", None), getattr(hf_config, "architectures", None)
    )


def sliding_window_of(hf_config: transformers.PretrainedConfig, layer: int) -> int:
    """Layer `layer`'s sliding window as transformers applies it: per `layer_types` where the
    config has them (Gemma, Qwen2/3 with use_sliding_window), else `sliding_window` for every
    layer (Mistral, Mixtral, Qwen3-MoE); NO_WINDOW for full attention."""
    window = getattr(hf_config, "sliding_window", None)
    layer_types = getattr(hf_config, "layer_types", None)
    if not window:
        return NO_WINDOW
    if layer_types is not None and layer_types[layer] != "sliding_attention":
        return NO_WINDOW
    return int(window)


def _mla_parameters(cfg: transformers.PretrainedConfig) -> int:
    """A multi-head latent attention layer's projection parameters (DeepSeek), 0 for others."""
    rank = getattr(cfg, "kv_lora_rank", None)
    if not rank:
        return 0
    h, heads = cfg.hidden_size, cfg.num_attention_heads
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    q_rank = cfg.q_lora_rank
    q = h * heads * qk if q_rank is None else h * q_rank + q_rank * heads * qk
    kv = h * (rank + cfg.qk_rope_head_dim) + rank * heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    return q + kv + heads * cfg.v_head_dim * h


def is_moe_layer(hf_config: transformers.PretrainedConfig, layer: int) -> bool:
    """Whether a layer's MLP is a mixture of experts: every layer of Mixtral; Qwen3-MoE's
    every `decoder_sparse_step`-th layer not in `mlp_only_layers`; DeepSeek's from
    `first_k_dense_replace` on."""
    experts = getattr(hf_config, "num_experts", None) or getattr(
        hf_config, "num_local_experts", None
    )
    if not experts:
        return False
    step = getattr(hf_config, "decoder_sparse_step", 1) or 1
    dense = getattr(hf_config, "mlp_only_layers", None) or ()
    first_sparse = getattr(hf_config, "first_k_dense_replace", 0) or 0
    return layer >= first_sparse and layer not in dense and (layer + 1) % step == 0


def as_id_set(value: int | Iterable[int] | None) -> set[int]:
    """Token ids in configs come as None, one int or a list; normalise to a set."""
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


def rope_of(hf_config: transformers.PretrainedConfig) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, scaling parameters or None) from either the v5 or the v4 spelling."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    theta = params.pop("rope_theta", None) or getattr(hf_config, "rope_theta", None) or 10000.0
    if not params:
        params = dict(getattr(hf_config, "rope_scaling", None) or {})
        params.pop("rope_theta", None)
    rope_type = params.get("rope_type", params.get("type", "default"))
    return float(theta), (None if rope_type == "default" else params)


def build_model_config(
    hf_config: transformers.PretrainedConfig,
    *,
    dtype: str,
    device: str,
    context_length: int | None,
    eos_token_ids: set[int],
) -> ModelConfig:
    """Flatten an HF config into a `ModelConfig`; `eos_token_ids` is merged with the config's own."""
    architecture = architecture_of(hf_config)
    num_heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
    context_len = context_length or hf_config.max_position_embeddings
    if context_len <= 0:
        raise ValueError(f"context length must be positive, got {context_len}")
    rope_theta, rope_scaling = rope_of(hf_config)
    return ModelConfig(
        hf_config=hf_config,
        architecture=architecture,
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        num_hidden_layers=hf_config.num_hidden_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
        head_dim=head_dim,
        context_len=context_len,
        eos_token_ids=eos_token_ids | as_id_set(hf_config.eos_token_id),
        dtype=resolve_dtype(dtype, device, hf_config),
        intermediate_size=hf_config.intermediate_size,
        rms_norm_eps=hf_config.rms_norm_eps,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        attention_bias=architecture == "Qwen2ForCausalLM"
        or bool(getattr(hf_config, "attention_bias", False)),
        qk_norm=architecture in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Gemma3ForCausalLM"),
        sliding_windows=tuple(
            sliding_window_of(hf_config, i) for i in range(hf_config.num_hidden_layers)
        ),
        num_experts=getattr(hf_config, "num_local_experts", 0)
        or getattr(hf_config, "num_experts", 0)
        or 0,
        num_experts_per_tok=getattr(hf_config, "num_experts_per_tok", 0) or 0,
        moe_intermediate_size=getattr(hf_config, "moe_intermediate_size", None)
        or (hf_config.intermediate_size if getattr(hf_config, "num_local_experts", 0) else 0),
    )
