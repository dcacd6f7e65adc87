"""Random weights from a config: tiny models for tests, real shapes for memory and speed work.

Each tensor gets its own generator seeded from (seed, parameter name), so the weights depend only
on the seed, not on the order they are read in, and tensors are made one at a time: an 8B shape
never needs two copies of the model in memory.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig

from radixserve.catalog.architectures import check_architecture

INIT_STD = 0.02
# biases drawn like matrices, not zeroed: attention's (to exercise them) and DeepSeek-V3's
# routing correction (zero would leave the expert choice untested)
_ATTENTION_BIAS_SUFFIXES = (
    "q_proj.bias",
    "k_proj.bias",
    "v_proj.bias",
    "e_score_correction_bias",
)

_TINY_SHAPE: dict[str, Any] = {
    "vocab_size": 1024,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}

PRESETS: dict[str, dict[str, Any]] = {
    "tiny-llama": {"model_type": "llama", **_TINY_SHAPE},
    "tiny-mistral": {"model_type": "mistral", **_TINY_SHAPE, "sliding_window": None},
    # Qwen2 always has q/k/v biases: the preset exists to exercise them.
    "tiny-qwen2": {"model_type": "qwen2", **_TINY_SHAPE, "tie_word_embeddings": True},
    # Qwen3: per-head q_norm/k_norm and a head_dim that is not hidden_size / heads.
    "tiny-qwen3": {"model_type": "qwen3", **_TINY_SHAPE, "head_dim": 32},
    # Mistral whose sliding window is shorter than the test prompts
    "tiny-mistral-sw": {"model_type": "mistral", **_TINY_SHAPE, "sliding_window": 16},
    # Qwen3-MoE: 8 experts, top 2 renormalised; layer 1 dense (mlp_only_layers)
    "tiny-qwen3-moe": {
        "model_type": "qwen3_moe",
        **_TINY_SHAPE,
        "num_hidden_layers": 3,
        "head_dim": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "mlp_only_layers": [1],
    },
    # Mixtral: 4 experts, top 2 (always renormalised), routing weights kept in float32
    "tiny-mixtral": {
        "model_type": "mixtral",
        **_TINY_SHAPE,
        "intermediate_size": 48,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": None,
    },
    # Gemma 2: local (window 16) and global layers, soft-caps small enough that the tiny
    # model's scores and logits reach tanh's curve, a query scalar that is not head_dim
    "tiny-gemma2": {
        "model_type": "gemma2",
        **_TINY_SHAPE,
        "head_dim": 16,
        "query_pre_attn_scalar": 24,
        "sliding_window": 16,
        "attn_logit_softcapping": 0.1,
        "final_logit_softcapping": 1.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
    },
    # Gemma 3 text: two local layers (window 16, RoPE base 10k) around a global one (base 1M,
    # linear scaling), q/k norms
    "tiny-gemma3": {
        "model_type": "gemma3_text",
        **_TINY_SHAPE,
        "num_hidden_layers": 3,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
        },
        "tie_word_embeddings": True,
    },
    # gpt-oss: sliding (window 16) and full layers alternating, attention sinks, YaRN, 8
    # experts (top 2) with biases and the clamped SwiGLU, its limit low enough to bite on
    # random weights; sizes multiples of 32 (MXFP4 groups)
    "tiny-gpt-oss": {
        "model_type": "gpt_oss",
        **_TINY_SHAPE,
        "intermediate_size": 64,
        "num_hidden_layers": 3,
        "head_dim": 16,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "sliding_window": 16,
        "swiglu_limit": 0.1,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 4.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 512,
        },
    },
    "gpt-oss-20b": {
        "model_type": "gpt_oss",
        "vocab_size": 201088,
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_hidden_layers": 24,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "num_local_experts": 32,
        "num_experts_per_tok": 4,
        "sliding_window": 128,
        "swiglu_limit": 7.0,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
        "bos_token_id": 199998,
        "eos_token_id": 200002,
        "tie_word_embeddings": False,
    },
    # DeepSeek-V3's layout: MLA with q-LoRA and interleaved rotary dims, YaRN (its softmax
    # scale), one dense layer then MoE layers: shared expert, sigmoid routing with the
    # correction bias over 4 groups of which 2 are kept, renormalised and scaled
    "tiny-deepseek-v3": {
        "model_type": "deepseek_v3",
        **_TINY_SHAPE,
        "num_hidden_layers": 3,
        "num_key_value_heads": 4,
        "q_lora_rank": 48,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_group": 4,
        "topk_group": 2,
        "n_shared_experts": 1,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "rope_interleave": True,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 512,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    },
    # DeepSeek-V2-Lite's layout: MLA without q-LoRA, softmax greedy routing unnormalised, two
    # shared experts, YaRN with V2-Lite's mscales
    "tiny-deepseek-v2-lite": {
        "model_type": "deepseek_v2",
        **_TINY_SHAPE,
        "num_hidden_layers": 3,
        "num_key_value_heads": 4,
        "q_lora_rank": None,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "n_routed_experts": 8,
        "num_experts_per_tok": 3,
        "n_shared_experts": 2,
        "moe_intermediate_size": 24,
        "first_k_dense_replace": 1,
        "topk_method": "greedy",
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "norm_topk_prob": False,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 512,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
        },
    },
    "llama-3.2-1b": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "tie_word_embeddings": True,
    },
    "llama-3-8b": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "tie_word_embeddings": False,
    },
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "tie_word_embeddings": False,
    },
    # DeepSeek-V2-Lite (15.7B parameters, 2.4B active): MLA over a 512 + 64 latent, 64
    # experts (6 per token) and 2 shared ones in 26 of 27 layers
    "deepseek-v2-lite": {
        "model_type": "deepseek_v2",
        "vocab_size": 102400,
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "moe_intermediate_size": 1408,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "q_lora_rank": None,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 64,
        "num_experts_per_tok": 6,
        "n_shared_experts": 2,
        "first_k_dense_replace": 1,
        "topk_method": "greedy",
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "norm_topk_prob": False,
        "max_position_embeddings": 163840,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
        },
        "bos_token_id": 100000,
        "eos_token_id": 100001,
        "tie_word_embeddings": False,
    },
    "qwen3-0.6b": {
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "tie_word_embeddings": True,
    },
}


def random_hf_config(spec: str) -> transformers.PretrainedConfig:
    """`spec` is a preset name or the path of a config.json."""
    if spec in PRESETS:
        values = dict(PRESETS[spec])
    elif spec.endswith(".json") and Path(spec).is_file():
        values = json.loads(Path(spec).read_text())
        if "model_type" not in values:
            raise ValueError(f"{spec} has no model_type")
    else:
        raise ValueError(
            f"random:{spec}: expected a preset ({', '.join(PRESETS)}) or the path of a config.json"
        )
    check_architecture(values.get("model_type"), values.get("architectures"))
    return AutoConfig.for_model(values.pop("model_type"), **values)


def parameter_shapes(hf_config: transformers.PretrainedConfig) -> list[tuple[str, torch.Size]]:
    """HF parameter names and shapes, from the transformers model built on the meta device (so
    names always match what `from_pretrained` would expect; tied weights appear once). Its
    model registry is imported here, not at the top: only random models pay for it."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    shapes = [(name, param.shape) for name, param in model.named_parameters()]
    # persistent buffers are checkpoint tensors too (DeepSeek-V3's e_score_correction_bias)
    saved = model.state_dict().keys()
    return shapes + [(name, b.shape) for name, b in model.named_buffers() if name in saved]


def _tensor_seed(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


def random_tensor(name: str, shape: torch.Size, seed: int, device: str = "cpu") -> torch.Tensor:
    """normal(0, 0.02) for matrices, embeddings, q/k/v biases and routing correction biases;
    ones for norm weights; zeros for other biases. Always drawn in float32 so a seed gives the same model in every dtype.
    On CUDA the draw happens on the device (an 8B shape in seconds, not minutes); a seed then
    gives the same model on every CUDA device, but not the CPU's model."""
    if name.endswith(_ATTENTION_BIAS_SUFFIXES) or len(shape) > 1:
        generator = torch.Generator(device).manual_seed(_tensor_seed(seed, name))
        return torch.empty(shape, device=device).normal_(0.0, INIT_STD, generator=generator)
    if name.endswith(".weight"):
        return torch.ones(shape, device=device)
    return torch.zeros(shape, device=device)


def _draws_on(device: str) -> str:
    return "cuda" if str(device).startswith("cuda") else "cpu"


def random_weights(
    shapes: list[tuple[str, torch.Size]], seed: int, dtype: torch.dtype, device: str = "cpu"
) -> Iterator[tuple[str, torch.Tensor]]:
    draw_on = _draws_on(device)
    for name, shape in shapes:
        yield name, random_tensor(name, shape, seed, draw_on).to(dtype)


def load_device_bytes(shapes: list[tuple[str, torch.Size]], dtype: torch.dtype, device: str) -> int:
    """What `random_weights` holds on a GPU beside the parameters at its peak: the largest
    tensor's float32 draw and its cast to `dtype` (nothing where it draws on the CPU)."""
    if _draws_on(device) == "cpu":
        return 0
    return (4 + dtype.itemsize) * max(shape.numel() for _, shape in shapes)
