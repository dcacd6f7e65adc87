"""Small random-weight model configurations the GPU tests share, written where the `random:`
loader can read them."""

from __future__ import annotations

import json
from pathlib import Path

# head_dim 64: a size every GPU backend (FlashInfer too) has kernels for
SMALL_LLAMA = {
    "model_type": "llama",
    "vocab_size": 8192,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
# per-head q/k norm, tied embeddings, head_dim 128 independent of the hidden size
SMALL_QWEN3 = {
    "model_type": "qwen3",
    "vocab_size": 8192,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


def random_model(directory: Path, name: str, config: dict) -> str:
    """`random:<path>` for `config` written as `<directory>/<name>.json`."""
    path = directory / f"{name}.json"
    path.write_text(json.dumps(config))
    return f"random:{path}"


# MoE: 16 experts, top 4, one dense layer (mlp_only_layers)
SMALL_QWEN3_MOE = {
    "model_type": "qwen3_moe",
    "vocab_size": 8192,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "moe_intermediate_size": 256,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "norm_topk_prob": True,
    "mlp_only_layers": [1],
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}
# Mixtral with a sliding window shorter than the prompts
SMALL_MIXTRAL = {
    "model_type": "mixtral",
    "vocab_size": 8192,
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "sliding_window": 128,
    "tie_word_embeddings": False,
}
# Gemma 2: a query scalar that is not head_dim (as the 27B's), real soft-caps, window 64
SMALL_GEMMA2 = {
    "model_type": "gemma2",
    "vocab_size": 8192,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "query_pre_attn_scalar": 144,
    "sliding_window": 64,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "max_position_embeddings": 4096,
}
# Gemma 3: five local layers (window 64, base 10k) to one global (base 1M, linear scaling 8)
SMALL_GEMMA3 = {
    "model_type": "gemma3_text",
    "vocab_size": 8192,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "query_pre_attn_scalar": 128,
    "sliding_window": 64,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
    },
    "max_position_embeddings": 4096,
}
# gpt-oss: sinks, 64-token sliding layers alternating with full ones, YaRN, 16 experts (top 4)
# with biases and the clamped SwiGLU, its limit low enough to bite on random weights
SMALL_GPT_OSS = {
    "model_type": "gpt_oss",
    "vocab_size": 8192,
    "hidden_size": 512,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_local_experts": 16,
    "num_experts_per_tok": 4,
    "sliding_window": 64,
    "swiglu_limit": 0.5,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 8.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 512,
    },
    "max_position_embeddings": 4096,
}
