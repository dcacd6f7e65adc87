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
