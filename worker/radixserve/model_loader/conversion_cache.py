"""Conversions worth doing once: results kept under the cache directory, written atomically.

A GGUF file's tokenizer and its dequantized weights take seconds to derive and are the same
every time, for every process of a worker and every worker on a node (the operator puts the
cache on the model-cache volume). The first process to take a conversion's lock converts and
writes into a staging directory that it renames into place, so no reader ever sees half of it;
a process that starts meanwhile waits for the lock and reads what the first one wrote.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

logger = logging.getLogger(__name__)


def cache_root() -> Path:
    root = os.environ.get("RADIXSERVE_CACHE_DIR") or Path.home() / ".cache" / "radixserve"
    return Path(root)


def cache_key(source: Path, *extra: str) -> str:
    """A file's conversions are keyed by its path, size and mtime, and what else they depend
    on (the converter's version)."""
    stat = source.stat()
    key = ":".join([str(source.resolve()), str(stat.st_size), str(stat.st_mtime_ns), *extra])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def converted_once(
    cache_dir: Path,
    write: Callable[[Path], object],
    complete: Callable[[Path], bool],
    what: str,
) -> Path | None:
    """`cache_dir` once it holds the conversion (`complete`), written by `write(directory)` if
    it did not; None when the cache location cannot be written (the caller converts itself)."""
    if complete(cache_dir):
        return cache_dir
    try:
        cache_dir.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(cache_dir.with_name(cache_dir.name + ".lock")):
            if not complete(cache_dir):  # not written while we waited
                logger.info("converting %s (cached in %s after this time)", what, cache_dir)
                _write_atomically(write, cache_dir)
            return cache_dir
    except OSError as exc:  # a read-only or missing cache location
        logger.info("not caching %s in %s: %s", what, cache_dir, exc)
        return None


def _write_atomically(write: Callable[[Path], object], cache_dir: Path) -> None:
    """Write into a staging directory beside the cache, then rename it into place."""
    staging = Path(tempfile.mkdtemp(prefix=f"{cache_dir.name}.", dir=cache_dir.parent))
    try:
        write(staging)
        staging.rename(cache_dir)
    except OSError as exc:
        # Already there: a writer the lock could not see (another machine on a shared volume).
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
