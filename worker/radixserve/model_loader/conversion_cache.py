"""Conversions worth doing once: results kept under the cache directory, written atomically.

A GGUF file's tokenizer and its dequantized weights take seconds to derive and are the same
every time, for every process of a worker and every worker on a node (the operator puts the
cache on the model-cache volume). The first process to take a conversion's lock converts and
writes into a staging directory that it renames into place, so no reader ever sees half of it;
a process that starts meanwhile waits for the lock and reads what the first one wrote.

Each conversion records the file it came from. A conversion of a file whose path now holds
another file (a model replaced in place, a package reinstalled into the same virtualenv) can
never be read again, so writing the new one removes it: without that, every such update left a
float32 copy seven times the GGUF's size in the cache for good. A conversion whose file is gone
is kept, as the cache may be shared with pods that mount other volumes. (A Hub download's
revisions are distinct files, each kept, as the Hub's own cache keeps them.)
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock, Timeout

logger = logging.getLogger(__name__)

# inside every conversion: the path, size and mtime of the file it was converted from
SOURCE_RECORD = "source.json"


def cache_root() -> Path:
    root = os.environ.get("RADIXSERVE_CACHE_DIR") or Path.home() / ".cache" / "radixserve"
    return Path(root)


def source_record(source: Path) -> dict[str, object]:
    """What identifies the file a conversion comes from: its path, size and mtime."""
    stat = source.stat()
    return {"path": str(source.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _directory(kind: str, record: dict[str, object], version: str) -> Path:
    key = ":".join([str(record["path"]), str(record["size"]), str(record["mtime_ns"]), version])
    return cache_root() / kind / hashlib.sha256(key.encode()).hexdigest()[:16]


def conversion_dir(kind: str, source: Path, version: str) -> Path:
    """Where the `kind` conversion of `source` by converter `version` is kept: keyed by the
    file's `source_record` and that version."""
    return _directory(kind, source_record(source), version)


def converted_once(
    kind: str,
    source: Path,
    version: str,
    write: Callable[[Path], object],
    complete: Callable[[Path], bool],
    what: str,
) -> Path | None:
    """The `kind` conversion of `source` (`conversion_dir`) once it is `complete`, written by
    `write(directory)` if it was not; None when the cache location cannot be written (the
    caller converts itself)."""
    record = source_record(source)
    cache_dir = _directory(kind, record, version)
    if complete(cache_dir):
        return cache_dir
    try:
        cache_dir.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(_lock_path(cache_dir)):
            if not complete(cache_dir):  # not written while we waited
                logger.info("converting %s (cached in %s after this time)", what, cache_dir)
                _write_atomically(write, record, cache_dir)
                _remove_superseded(cache_dir, record)
            return cache_dir
    except OSError as exc:  # a read-only or missing cache location
        logger.info("not caching %s in %s: %s", what, cache_dir, exc)
        return None


def _lock_path(cache_dir: Path) -> Path:
    return cache_dir.with_name(cache_dir.name + ".lock")


def _write_atomically(
    write: Callable[[Path], object], record: dict[str, object], cache_dir: Path
) -> None:
    """Write into a staging directory beside the cache, then rename it into place."""
    staging = Path(tempfile.mkdtemp(prefix=f"{cache_dir.name}.", dir=cache_dir.parent))
    try:
        write(staging)
        (staging / SOURCE_RECORD).write_text(json.dumps(record))
        staging.rename(cache_dir)
    except OSError as exc:
        # Already there: a writer the lock could not see (another machine on a shared volume).
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _remove_superseded(kept: Path, record: dict[str, object]) -> None:
    """Remove the conversions beside `kept` of an earlier file at the same path (its size or
    mtime differs from `record`'s). A process still reading one keeps its open files; one
    converting it now holds its lock, and that conversion is left to it."""
    for other in kept.parent.iterdir():
        if other == kept or not other.is_dir():
            continue
        try:
            earlier = json.loads((other / SOURCE_RECORD).read_text())
        except (OSError, ValueError):
            continue  # a staging directory, or a conversion that records no source
        if earlier.get("path") != record["path"] or earlier == record:
            continue
        try:
            with FileLock(_lock_path(other), timeout=0):
                logger.info("removing %s: converted from an earlier %s", other, record["path"])
                shutil.rmtree(other, ignore_errors=True)
                # nobody asks for this key again: its file's size or mtime are gone for good
                _lock_path(other).unlink(missing_ok=True)
        except Timeout:
            continue
        except OSError as exc:  # the new conversion stands all the same
            logger.info("could not remove %s: %s", other, exc)
