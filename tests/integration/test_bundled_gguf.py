"""The bundled SmolLM2-135M GGUF against transformers' own GGUF loader: config, every
dequantized weight, the tokenizer and the reference model built from it. (Dequantizing 135M
parameters twice takes tens of seconds: an integration test, not a unit one.)"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from radixserve.model_loader.loader import ModelSource, build_hf_reference, load_model_source
from radixserve.model_loader.tokenizer import BUNDLED_VOCAB_SIZE, bundled_gguf_path


@pytest.fixture(scope="module")
def bundled() -> ModelSource:
    return load_model_source("builtin:smollm2-135m")


@pytest.fixture(scope="module")
def bundled_weights(bundled: ModelSource) -> dict[str, torch.Tensor]:
    return dict(bundled.weights())


@pytest.fixture(scope="module")
def transformers_gguf_state() -> dict[str, torch.Tensor]:
    path = bundled_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    return model.state_dict()


def test_bundled_config_is_smollm2_135m(bundled: ModelSource) -> None:
    config = bundled.config
    assert config.architecture == "LlamaForCausalLM"
    assert isinstance(config.hf_config, LlamaConfig)
    assert (config.vocab_size, config.hidden_size, config.intermediate_size) == (49152, 576, 1536)
    assert (config.num_hidden_layers, config.num_attention_heads) == (30, 9)
    assert (config.num_key_value_heads, config.head_dim) == (3, 64)
    assert config.context_len == 8192
    assert config.rope_theta == 100000.0 and config.rope_scaling is None
    assert math.isclose(config.rms_norm_eps, 1e-5, rel_tol=1e-6)
    assert config.tie_word_embeddings
    assert config.dtype == torch.float32
    assert config.eos_token_ids == {bundled.tokenizer.convert_tokens_to_ids("<|im_end|>")}
    assert "GGUF" in bundled.description


def test_bundled_weights_equal_transformers_gguf_loading(
    bundled_weights: dict[str, torch.Tensor], transformers_gguf_state: dict[str, torch.Tensor]
) -> None:
    # transformers repeats the tied embedding as lm_head.weight; we yield it once.
    expected_names = set(transformers_gguf_state) - {"lm_head.weight"}
    assert set(bundled_weights) == expected_names
    for name, tensor in bundled_weights.items():
        assert tensor.dtype == torch.float32, name
        assert torch.equal(tensor, transformers_gguf_state[name]), name


def test_bundled_tokenizer_round_trips_and_renders_chat(bundled: ModelSource) -> None:
    tokenizer = bundled.tokenizer
    text = "Radix trees share prefixes: 42 tokens, café!"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    messages = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert "<|im_start|>user\nWhat is 2+2?<|im_end|>" in rendered
    assert "<|im_start|>assistant\n4<|im_end|>" in rendered
    assert len(tokenizer) == BUNDLED_VOCAB_SIZE


def test_build_hf_reference_matches_source_and_transformers(
    bundled: ModelSource,
    bundled_weights: dict[str, torch.Tensor],
    transformers_gguf_state: dict[str, torch.Tensor],
) -> None:
    # Reuse the dequantized tensors: dequantizing 135M parameters again costs seconds.
    reference = build_hf_reference(
        dataclasses.replace(bundled, weights_factory=lambda: iter(bundled_weights.items()))
    )
    assert not reference.training
    state = reference.state_dict()
    for name, tensor in bundled_weights.items():
        assert torch.equal(state[name], tensor), name
    assert torch.equal(state["lm_head.weight"], transformers_gguf_state["lm_head.weight"])
