"""Model loading: GGUF pieces and written GGUF files, HF directories, random presets and the
errors for model strings we cannot load (the bundled GGUF against transformers' own loader is
an integration test: tests/integration/test_bundled_gguf.py)."""

from __future__ import annotations

import concurrent.futures
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from radixserve.model_loader import gguf_file as gguf_file_module
from radixserve.model_loader import random_init
from radixserve.model_loader import tokenizer as tokenizer_module
from radixserve.model_loader.config import resolve_dtype
from radixserve.model_loader.gguf_file import (
    hf_tensor_name,
    llama3_frequency_divisors,
    unpermute_rotary,
)
from radixserve.model_loader.loader import (
    build_hf_reference,
    load_model_source,
)
from radixserve.model_loader.tokenizer import (
    BUNDLED_VOCAB_SIZE,
    bundled_tokenizer,
    convert_gguf_tokenizer,
    gguf_tokenizer_cache_path,
    load_gguf_tokenizer,
)

TINY_PRESETS = ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3"]


@pytest.fixture(scope="module", autouse=True)
def private_tokenizer_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Converted GGUF tokenizers are cached on disk; tests start from an empty cache of their own."""
    cache = tmp_path_factory.mktemp("radixserve_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RADIXSERVE_CACHE_DIR", str(cache))
        yield cache


# --- GGUF pieces ------------------------------------------------------------------------------


def _llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, verbatim in numpy."""
    return (
        weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


@pytest.mark.parametrize("num_heads", [1, 3, 8])
def test_unpermute_rotary_inverts_llama_cpp_permute(num_heads: int) -> None:
    weight = np.random.default_rng(0).standard_normal((num_heads * 16, 24)).astype(np.float32)
    assert not np.array_equal(_llama_cpp_permute(weight, num_heads), weight)
    assert np.array_equal(
        unpermute_rotary(_llama_cpp_permute(weight, num_heads), num_heads), weight
    )


def test_hf_tensor_names() -> None:
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    assert hf_tensor_name("output_norm.weight") == "model.norm.weight"
    assert hf_tensor_name("blk.12.attn_q.bias") == "model.layers.12.self_attn.q_proj.bias"
    assert hf_tensor_name("blk.0.attn_k_norm.weight") == "model.layers.0.self_attn.k_norm.weight"
    assert hf_tensor_name("blk.3.ffn_down.weight") == "model.layers.3.mlp.down_proj.weight"
    with pytest.raises(ValueError, match="no Hugging Face counterpart"):
        hf_tensor_name("blk.0.ffn_gate_exps.weight")


def test_llama3_rope_freqs_match_transformers_llama3_rope() -> None:
    params = random_init.PRESETS["llama-3.2-1b"]["rope_scaling"]
    config = random_init.random_hf_config("llama-3.2-1b")
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    head_dim = config.head_dim
    plain = 1.0 / 500000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    divisors = llama3_frequency_divisors(500000.0, head_dim, params)
    np.testing.assert_allclose(divisors, (plain / scaled.double()).numpy(), rtol=1e-5)
    assert divisors.max() == pytest.approx(32.0) and divisors.min() == pytest.approx(1.0)


# --- a GGUF file written the way llama.cpp's converter writes one -----------------------------

_TEST_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_TEST_MERGES = ["h e", "l l", "he ll", "Ġ w"]
_TEST_CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
_GGUF_BLOCK_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf_name(hf_name: str) -> str:
    globals_ = {
        "model.embed_tokens": "token_embd",
        "model.norm": "output_norm",
        "lm_head": "output",
    }
    stem, suffix = hf_name.rsplit(".", 1)
    if stem in globals_:
        return f"{globals_[stem]}.{suffix}"
    _, _, layer, part = stem.split(".", 3)
    return f"blk.{layer}.{_GGUF_BLOCK_NAMES[part]}.{suffix}"


def _quant_type(hf_name: str) -> gguf.GGMLQuantizationType:
    """A mix of storage types, as in real quantized files."""
    if hf_name.endswith("norm.weight"):
        return gguf.GGMLQuantizationType.F32
    if "v_proj" in hf_name or "o_proj" in hf_name:
        return gguf.GGMLQuantizationType.F16
    if "q_proj" in hf_name or "k_proj" in hf_name:
        return gguf.GGMLQuantizationType.F32  # exact, so the permutation is checked exactly
    return gguf.GGMLQuantizationType.Q8_0


def _write_gguf(
    path: Path, config: transformers.PretrainedConfig, state: dict[str, torch.Tensor]
) -> None:
    """A byte-level BPE vocabulary, the model's metadata and its tensors quantized like
    convert_hf_to_gguf.py does; for llama also Q/K permuted and Llama 3.1's `rope_freqs`."""
    is_llama = config.model_type == "llama"
    tokens = list(bytes_to_unicode().values())
    tokens += [merge.replace(" ", "") for merge in _TEST_MERGES] + _TEST_SPECIAL_TOKENS
    assert len(tokens) == config.vocab_size
    writer = gguf.GGUFWriter(str(path), config.model_type)
    writer.add_name(f"tiny {config.model_type} test")
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_vocab_size(config.vocab_size)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 3) + [3, 3, 3])
    writer.add_token_merges(_TEST_MERGES)
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eot_token_id(tokens.index("<|im_end|>"))
    writer.add_chat_template(_TEST_CHAT_TEMPLATE)
    if is_llama:
        divisors = llama3_frequency_divisors(
            config.rope_parameters["rope_theta"], config.head_dim, config.rope_parameters
        )
        writer.add_tensor("rope_freqs.weight", divisors.astype(np.float32))
    for name, tensor in state.items():
        values = tensor.numpy()
        if is_llama and "q_proj" in name:
            values = _llama_cpp_permute(values, config.num_attention_heads)
        elif is_llama and "k_proj" in name:
            values = _llama_cpp_permute(values, config.num_key_value_heads)
        qtype = _quant_type(name)
        if qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(_gguf_name(name), values.astype(np.float16))
        elif qtype == gguf.GGMLQuantizationType.Q8_0:
            quantized = gguf.quants.quantize(values, qtype)
            writer.add_tensor(
                _gguf_name(name), quantized, raw_shape=quantized.shape, raw_dtype=qtype
            )
        else:
            writer.add_tensor(_gguf_name(name), values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _stored_value(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """What a GGUF reader must get back for `tensor` after it went through `_quant_type`."""
    qtype = _quant_type(name)
    if qtype == gguf.GGMLQuantizationType.F16:
        return tensor.half().float()
    if qtype == gguf.GGMLQuantizationType.Q8_0:
        quantized = gguf.quants.quantize(tensor.numpy(), qtype)
        return torch.from_numpy(gguf.quants.dequantize(quantized, qtype))
    return tensor


@pytest.fixture(scope="module")
def written_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LlamaConfig, dict]:
    vocab_size = 256 + len(_TEST_MERGES) + len(_TEST_SPECIAL_TOKENS)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_scaling={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    state = {k: v.clone() for k, v in AutoModelForCausalLM.from_config(config).state_dict().items()}
    directory = tmp_path_factory.mktemp("gguf_only")
    _write_gguf(directory / "tiny.Q8_0.gguf", config, state)
    return directory / "tiny.Q8_0.gguf", config, state


@pytest.mark.parametrize("cached", [True, False], ids=["dequantized-cache", "from-the-file"])
def test_written_gguf_round_trips_config_weights_and_tokenizer(
    written_gguf: tuple[Path, LlamaConfig, dict[str, torch.Tensor]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cached: bool,
) -> None:
    """Loaded from its dequantized copy in the cache (a small file, the second time) or
    straight from the file (too big to keep dequantized): the same model either way."""
    path, hf_config, state = written_gguf
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path))
    if not cached:
        monkeypatch.setattr(gguf_file_module, "DEQUANTIZED_CACHE_MAX_FILE_BYTES", 0)
    load_model_source(str(path))  # the first load converts, when it caches
    source = load_model_source(str(path))
    copies = list((tmp_path / "dequantized").glob("*/model.safetensors"))
    assert bool(copies) == cached
    config = source.config
    assert config.architecture == "LlamaForCausalLM" and not config.tie_word_embeddings
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (
        hf_config.vocab_size,
        64,
        2,
    )
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 16)
    assert config.context_len == 1024 and config.rope_theta == 500000.0
    assert config.rope_scaling == {
        key: value for key, value in hf_config.rope_parameters.items() if key != "rope_theta"
    }
    tokenizer = source.tokenizer
    assert config.eos_token_ids == {
        tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>")
    }
    weights = dict(source.weights())
    assert set(weights) == set(state)
    for name, tensor in weights.items():
        assert torch.equal(tensor, _stored_value(name, state[name])), name
    assert (
        tokenizer.decode(tokenizer.encode("hello world", add_special_tokens=False)) == "hello world"
    )
    assert tokenizer.chat_template == _TEST_CHAT_TEMPLATE


def test_written_qwen3_gguf_keeps_qk_norm_and_head_dim(tmp_path: Path) -> None:
    config = Qwen3Config(
        vocab_size=256 + len(_TEST_MERGES) + len(_TEST_SPECIAL_TOKENS),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    )
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(config)
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    for name in (
        "model.layers.0.self_attn.q_norm.weight",
        "model.layers.0.self_attn.k_norm.weight",
    ):
        state[name] = torch.rand(32) + 0.5  # not all ones, so a swap would show
    _write_gguf(tmp_path / "qwen3.gguf", config, state)
    source = load_model_source(str(tmp_path / "qwen3.gguf"))
    assert source.config.architecture == "Qwen3ForCausalLM"
    assert source.config.qk_norm and source.config.tie_word_embeddings
    assert (source.config.head_dim, source.config.rope_theta) == (32, 1000000.0)
    weights = dict(source.weights())
    assert set(weights) == set(state)
    for name, tensor in weights.items():
        assert torch.equal(tensor, _stored_value(name, state[name])), name


def test_gguf_tokenizer_is_converted_once_then_read_from_the_cache(
    written_gguf: tuple[Path, LlamaConfig, dict[str, torch.Tensor]],
    private_tokenizer_cache: Path,
) -> None:
    path, _, _ = written_gguf
    cache = gguf_tokenizer_cache_path(path)
    assert cache.is_relative_to(private_tokenizer_cache)
    load_gguf_tokenizer(path)
    assert (cache / "tokenizer_config.json").is_file()
    cached, converted = load_gguf_tokenizer(path), convert_gguf_tokenizer(path)
    text = "<|im_start|>hello world<|im_end|>"
    assert cached.encode(text) == converted.encode(text)
    assert cached.convert_tokens_to_ids("<|im_end|>") == converted.convert_tokens_to_ids(
        "<|im_end|>"
    )
    assert len(cached.encode("<|im_end|>", add_special_tokens=False)) == 1
    assert (cached.bos_token_id, cached.eos_token_id) == (
        converted.bos_token_id,
        converted.eos_token_id,
    )
    assert cached.chat_template == converted.chat_template == _TEST_CHAT_TEMPLATE


def test_concurrent_first_loads_convert_once_and_both_succeed(
    written_gguf: tuple[Path, LlamaConfig, dict[str, torch.Tensor]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The front end and the scheduler load the tokenizer at the same moment on first start:
    one converts and writes the cache atomically, the other waits and reads it (no error)."""
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path))
    path, _, _ = written_gguf
    conversions = []
    convert = tokenizer_module.convert_gguf_tokenizer

    def slow_convert(gguf_path: Path) -> transformers.PreTrainedTokenizerBase:
        conversions.append(gguf_path)
        time.sleep(0.5)  # both threads are surely inside load_gguf_tokenizer meanwhile
        return convert(gguf_path)

    monkeypatch.setattr(tokenizer_module, "convert_gguf_tokenizer", slow_convert)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        loaded = list(pool.map(load_gguf_tokenizer, [path, path]))
    assert len(conversions) == 1
    text = "<|im_start|>hello world<|im_end|>"
    assert loaded[0].encode(text) == loaded[1].encode(text)
    cache = gguf_tokenizer_cache_path(path)
    # the cache and its lock, no staging directory left behind
    assert sorted(p.name for p in cache.parent.iterdir()) == [cache.name, cache.name + ".lock"]


def test_a_cache_written_by_someone_else_meanwhile_is_kept(
    written_gguf: tuple[Path, LlamaConfig, dict[str, torch.Tensor]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A writer the lock cannot see (another node on a shared volume) renamed its copy into
    place first: the rename's ENOTEMPTY is not an error, and the first copy stays."""
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path))
    path, _, _ = written_gguf
    cache = gguf_tokenizer_cache_path(path)
    convert = tokenizer_module.convert_gguf_tokenizer

    def convert_while_another_writes(gguf_path: Path) -> transformers.PreTrainedTokenizerBase:
        tokenizer = convert(gguf_path)
        tokenizer.save_pretrained(str(cache))  # the other writer wins the race
        (cache / "marker").write_text("first")
        return tokenizer

    monkeypatch.setattr(tokenizer_module, "convert_gguf_tokenizer", convert_while_another_writes)
    assert load_gguf_tokenizer(path).encode("hello") == convert(path).encode("hello")
    assert (cache / "marker").read_text() == "first"
    assert sorted(p.name for p in cache.parent.iterdir()) == [cache.name, cache.name + ".lock"]


def test_directory_with_one_gguf_loads_it(
    written_gguf: tuple[Path, LlamaConfig, dict[str, torch.Tensor]],
) -> None:
    path, _, _ = written_gguf
    source = load_model_source(f"file://{path.parent}")
    assert str(path) in source.description and source.config.num_hidden_layers == 2


# --- a Hugging Face directory -----------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_directory(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A sharded tiny Qwen2 checkpoint with a tokenizer and an extra stop id in
    generation_config.json, written by transformers itself."""
    directory = tmp_path_factory.mktemp("hf_qwen2")
    config = Qwen2Config(
        vocab_size=BUNDLED_VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(directory, safe_serialization=True, max_shard_size="1MB")
    bundled_tokenizer().save_pretrained(directory)
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    return directory, {k: v.clone() for k, v in model.state_dict().items()}


def test_hf_directory_loads_identical_tensors_and_config(
    hf_directory: tuple[Path, dict[str, torch.Tensor]],
) -> None:
    directory, saved = hf_directory
    assert (directory / "model.safetensors.index.json").is_file()
    source = load_model_source(str(directory))
    config = source.config
    assert config.architecture == "Qwen2ForCausalLM"
    assert (config.hidden_size, config.num_hidden_layers, config.head_dim) == (32, 2, 8)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert config.context_len == 512 and config.attention_bias
    assert config.eos_token_ids == {2, 7}
    weights = dict(source.weights())
    assert set(weights) == set(saved)
    for name, tensor in weights.items():
        assert torch.equal(tensor, saved[name]), name
    assert source.tokenizer is not None and source.tokenizer.chat_template
    assert str(directory) in source.description


def test_hf_directory_casts_to_requested_dtype_and_context(
    hf_directory: tuple[Path, dict[str, torch.Tensor]],
) -> None:
    directory, saved = hf_directory
    source = load_model_source(f"file://{directory}", dtype="bfloat16", context_length=128)
    assert source.config.dtype == torch.bfloat16 and source.config.context_len == 128
    name, tensor = next(source.weights())
    assert tensor.dtype == torch.bfloat16
    assert torch.equal(tensor, saved[name].to(torch.bfloat16))


# --- random weights ---------------------------------------------------------------------------


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_random_preset_is_seeded_and_shaped_by_config(preset: str) -> None:
    first = dict(load_model_source(f"random:{preset}", seed=1).weights())
    again = dict(load_model_source(f"random:{preset}", seed=1).weights())
    other = dict(load_model_source(f"random:{preset}", seed=2).weights())
    assert first.keys() == again.keys() == other.keys()
    assert all(torch.equal(first[name], again[name]) for name in first)
    matrices = [name for name, tensor in first.items() if tensor.dim() == 2]
    assert all(not torch.equal(first[name], other[name]) for name in matrices)

    config = load_model_source(f"random:{preset}").config
    h, d = config.hidden_size, config.head_dim
    layer = "model.layers.1"
    assert first["model.embed_tokens.weight"].shape == (config.vocab_size, h)
    assert first[f"{layer}.self_attn.q_proj.weight"].shape == (config.num_attention_heads * d, h)
    assert first[f"{layer}.self_attn.k_proj.weight"].shape == (config.num_key_value_heads * d, h)
    assert first[f"{layer}.mlp.down_proj.weight"].shape == (h, config.intermediate_size)
    assert sum(name.startswith("model.layers.") for name in first) > 0
    assert torch.equal(first["model.norm.weight"], torch.ones(h))
    assert ("lm_head.weight" in first) != config.tie_word_embeddings
    std = first["model.embed_tokens.weight"].std().item()
    assert 0.015 < std < 0.025
    assert load_model_source(f"random:{preset}").tokenizer is None


def test_random_qwen2_has_random_qkv_bias_and_qwen3_has_qk_norm() -> None:
    qwen2 = dict(load_model_source("random:tiny-qwen2").weights())
    bias = qwen2["model.layers.0.self_attn.k_proj.bias"]
    assert bias.abs().sum() > 0 and bias.abs().max() < 0.2
    qwen3 = load_model_source("random:tiny-qwen3")
    assert qwen3.config.qk_norm and qwen3.config.head_dim == 32
    assert qwen3.config.head_dim * qwen3.config.num_attention_heads != qwen3.config.hidden_size
    norm = dict(qwen3.weights())["model.layers.0.self_attn.q_norm.weight"]
    assert torch.equal(norm, torch.ones(32))


def test_random_weights_same_values_in_every_dtype() -> None:
    full = dict(load_model_source("random:tiny-llama", seed=3).weights())
    half = dict(load_model_source("random:tiny-llama", seed=3, dtype="bfloat16").weights())
    assert all(half[name].dtype == torch.bfloat16 for name in half)
    assert all(torch.equal(half[name], full[name].to(torch.bfloat16)) for name in full)


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_build_hf_reference_holds_the_source_weights(preset: str) -> None:
    source = load_model_source(f"random:{preset}", seed=5)
    reference = build_hf_reference(source)
    assert isinstance(reference, transformers.PreTrainedModel) and not reference.training
    state = reference.state_dict()
    for name, tensor in source.weights():
        assert state[name].dtype == torch.float32
        assert torch.equal(state[name], tensor), name
    logits = reference(torch.tensor([[1, 5, 9]])).logits
    assert logits.shape == (1, 3, source.config.vocab_size) and torch.isfinite(logits).all()


def test_random_config_json_with_big_vocab_gets_bundled_tokenizer(tmp_path: Path) -> None:
    config_path = tmp_path / "config.json"
    config_path.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "vocab_size": BUNDLED_VOCAB_SIZE,
                "hidden_size": 16,
                "intermediate_size": 32,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "max_position_embeddings": 256,
            }
        )
    )
    source = load_model_source(f"random:{config_path}")
    assert source.config.vocab_size == BUNDLED_VOCAB_SIZE and source.config.context_len == 256
    assert source.tokenizer is bundled_tokenizer()
    assert 2 in source.config.eos_token_ids


def test_real_presets_have_their_published_shapes() -> None:
    llama_1b = random_init.random_hf_config("llama-3.2-1b")
    assert (llama_1b.vocab_size, llama_1b.hidden_size, llama_1b.num_hidden_layers) == (
        128256,
        2048,
        16,
    )
    assert llama_1b.rope_parameters["rope_type"] == "llama3"
    assert llama_1b.rope_parameters["factor"] == 32.0
    llama_8b = random_init.random_hf_config("llama-3-8b")
    assert (llama_8b.hidden_size, llama_8b.intermediate_size, llama_8b.num_key_value_heads) == (
        4096,
        14336,
        8,
    )
    qwen3 = random_init.random_hf_config("qwen3-0.6b")
    assert (qwen3.head_dim, qwen3.num_hidden_layers, qwen3.vocab_size) == (128, 28, 151936)
    shapes = dict(random_init.parameter_shapes(llama_8b))
    assert shapes["model.layers.31.mlp.gate_proj.weight"] == (14336, 4096)
    assert sum(math.prod(shape) for shape in shapes.values()) == 8_030_261_248


# --- dtype resolution and bad model strings ---------------------------------------------------


def test_resolve_dtype() -> None:
    bf16_checkpoint = LlamaConfig(dtype="float16")
    assert resolve_dtype("auto", "cpu", bf16_checkpoint) == torch.float32
    assert resolve_dtype("auto", "cuda", bf16_checkpoint) == torch.float16
    assert resolve_dtype("auto", "cuda", LlamaConfig(dtype="float32")) == torch.bfloat16
    assert resolve_dtype("float16", "cpu") == torch.float16
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("int8", "cpu")


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("hf://HuggingFaceTB/SmolLM2-135M-Instruct", "mount the checkpoint as a directory"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "cannot get 'HuggingFaceTB/SmolLM2-135M-Instruct'"),
        ("gpt-4", "Accepted: builtin:smollm2-135m"),
        ("/nonexistent/model.gguf", "Accepted:"),
        ("builtin:llama", "Accepted:"),
        ("random:huge-llama", "expected a preset"),
    ],
)
def test_bad_model_strings_say_what_is_accepted(
    model: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    # an empty, offline Hub cache: a repository id must fail clearly, not hang on the network
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match=message):
        load_model_source(model)


def test_directory_without_safetensors_is_rejected(tmp_path: Path) -> None:
    LlamaConfig(vocab_size=64, hidden_size=16, num_attention_heads=2).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        load_model_source(str(tmp_path))


def test_the_front_ends_tokenizer_is_the_schedulers_without_torch(
    hf_directory: tuple[Path, dict[str, torch.Tensor]],
) -> None:
    """The front end loads, torch-free, the directory the scheduler reports: it must encode,
    decode and render chats exactly as the scheduler's own tokenizer does."""
    from radixserve.frontend.tokenizer import load_frontend_tokenizer
    from radixserve.model_loader.tokenizer import frontend_tokenizer_dir

    directory, _ = hf_directory
    text = "Hello, radix world! <|im_end|> ünïcödé 🎉"
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    for model in (str(directory), "builtin:smollm2-135m"):
        source = load_model_source(model).tokenizer
        front = load_frontend_tokenizer(frontend_tokenizer_dir(source))
        assert front.encode(text) == source.encode(text), model
        ids = source.encode(text)
        assert front.decode(ids, skip_special_tokens=True) == source.decode(
            ids, skip_special_tokens=True
        )
        assert front.eos_token_id == source.eos_token_id
        if source.chat_template:
            assert front.apply_chat_template(
                chat, tokenize=False, add_generation_prompt=True
            ) == source.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert frontend_tokenizer_dir(None) is None
    assert load_frontend_tokenizer(None) is None


def test_every_catalogued_architecture_resolves_to_its_class():
    """One list (catalog/architectures.py) names the served families, each with its class as
    "module:Class"; the runner imports the class from there. Each entry must import, be a
    model, and be the class of the architecture it is served as (not an alias of another)."""
    from torch import nn

    from radixserve.catalog.architectures import (
        CLASS_BY_ARCHITECTURE,
        MODEL_CLASSES,
        SUPPORTED_ARCHITECTURES,
    )
    from radixserve.models.registry import get_model_class

    assert set(CLASS_BY_ARCHITECTURE) == set(SUPPORTED_ARCHITECTURES.values())
    for model_type, path in MODEL_CLASSES.items():
        architecture = SUPPORTED_ARCHITECTURES[model_type]
        cls = get_model_class(architecture)
        assert cls.__name__ == architecture, (model_type, path)
        assert f"{cls.__module__}:{cls.__qualname__}" == path
        assert issubclass(cls, nn.Module)
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'; supported: "):
        get_model_class("GPT2LMHeadModel")
