"""Conversions worth doing once: results kept under the cache directory, written atomically.

A GGUF file's tokenizer and its dequantized weights take seconds to derive and are the same
every time, for every process of a worker, every worker on a node (the operator puts the cache
on the model-cache volume) and every checkout or virtualenv on a machine. The first process to
take a conversion's lock converts and writes into a staging directory that it renames into
place, so no reader ever sees half of it; a process that starts meanwhile waits for the lock and
reads what the first one wrote.

A conversion is keyed by the *content* of the file it comes from (its sha256) and the
converter's version, not by the file's path: two clones of the repository, or a virtualenv
rebuilt in place, carry the same bundled model at different paths or mtimes and share one
conversion (about 0.5 GB for the bundled model) instead of one each. The digest is computed once
per file and remembered in a small sidecar (`digests/`, keyed by the file's path, size and
mtime), so a start reads a few bytes instead of hashing the file again (the bundled 98 MB GGUF
hashes in about 0.1 s; a multi-GB one would take seconds in each worker process).

Each conversion records the files it was used for (`sources` in `source.json`: path, size,
mtime). A replaced file gets another key, and its earlier content's conversion is removed when
no recorded file still holds that content: every file it records exists and has changed (a
model replaced in place, a package upgraded in the same virtualenv). Without that, every such
update left a float32 copy seven times the GGUF's size in the cache for good. A conversion one
of whose files is gone is kept, as the cache may be shared with pods that mount other volumes,
and so is one a file still holds unchanged (another clone's, or the same file's under another
converter version). Conversions written before content keys (a `source.json` with one `path`
and no digest) are removed once their file's content-keyed conversion is written. `make
clean-cache` (or deleting the directory) removes everything; it is rebuilt on the next start.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock, Timeout

from radixserve.server_args import cache_root

logger = logging.getLogger(__name__)

# inside every conversion: the content digest and the files (path, size, mtime) it was used for
SOURCE_RECORD = "source.json"
# beside the conversions: one small file per source path, its size, mtime and sha256
DIGESTS = "digests"


def source_record(source: Path) -> dict[str, object]:
    """Which file this is right now: its path, size and mtime."""
    stat = source.stat()
    return {"path": str(source.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def content_digest(source: Path) -> str:
    """The sha256 of `source`'s bytes, remembered (in the process and in a sidecar under the
    cache) for as long as the file keeps its path, size and mtime."""
    record = source_record(source)
    return _digest(str(record["path"]), int(record["size"]), int(record["mtime_ns"]))


@functools.lru_cache(maxsize=64)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    record = {"path": path, "size": size, "mtime_ns": mtime_ns}
    sidecar = cache_root() / DIGESTS / (hashlib.sha256(path.encode()).hexdigest()[:16] + ".json")
    try:
        remembered = json.loads(sidecar.read_text())
        if {k: remembered.get(k) for k in record} == record and remembered.get("sha256"):
            return str(remembered["sha256"])
    except (OSError, ValueError, AttributeError):
        pass  # not hashed yet, or a sidecar from an earlier file at this path
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    after = os.stat(path)
    if (after.st_size, after.st_mtime_ns) != (size, mtime_ns):
        return digest  # the file changed while it was read: nothing worth remembering
    try:
        sidecar.parent.mkdir(parents=True, exist_ok=True)
        fd, staging = tempfile.mkstemp(prefix=sidecar.name + ".", dir=sidecar.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(record | {"sha256": digest}, f)
        os.replace(staging, sidecar)
    except OSError as exc:  # a read-only cache: hash again next time
        logger.debug("not remembering the digest of %s: %s", path, exc)
    return digest


def _directory(kind: str, digest: str, version: str) -> Path:
    key = f"sha256:{digest}:{version}"
    return cache_root() / kind / hashlib.sha256(key.encode()).hexdigest()[:16]


def conversion_dir(kind: str, source: Path, version: str) -> Path:
    """Where the `kind` conversion of `source` by converter `version` is kept: keyed by the
    file's content (`content_digest`) and that version."""
    return _directory(kind, content_digest(source), version)


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
    digest = _digest(str(record["path"]), int(record["size"]), int(record["mtime_ns"]))
    cache_dir = _directory(kind, digest, version)
    if complete(cache_dir):
        _note_source(cache_dir, record, digest)
        return cache_dir
    try:
        cache_dir.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(_lock_path(cache_dir)):
            if complete(cache_dir):  # written while we waited
                _add_source(cache_dir, record, digest)
            else:
                logger.info("converting %s (cached in %s after this time)", what, cache_dir)
                _write_atomically(write, {"sha256": digest, "sources": [record]}, cache_dir)
            _remove_superseded(cache_dir, record)
            return cache_dir
    except OSError as exc:  # a read-only or missing cache location
        logger.info("not caching %s in %s: %s", what, cache_dir, exc)
        return None


def _lock_path(cache_dir: Path) -> Path:
    return cache_dir.with_name(cache_dir.name + ".lock")


def _sources(conversion: Path) -> tuple[list[dict[str, object]], bool] | None:
    """The files a conversion records, and whether it is content-keyed; None when it records
    none readably (a staging directory, a conversion being written)."""
    try:
        record = json.loads((conversion / SOURCE_RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    if "sha256" in record:
        return [s for s in record.get("sources", []) if isinstance(s, dict)], True
    return ([record], False) if "path" in record else None


def _note_source(cache_dir: Path, record: dict[str, object], digest: str) -> None:
    """Record `record`'s file as a user of the complete conversion `cache_dir` (once per file
    and mtime; a cache another user cannot write is read all the same)."""
    known = _sources(cache_dir)
    if known is not None and record in known[0]:
        return
    try:
        with FileLock(_lock_path(cache_dir), timeout=30):
            _add_source(cache_dir, record, digest)
            _remove_superseded(cache_dir, record)
    except (OSError, Timeout) as exc:
        logger.debug("not recording %s as a user of %s: %s", record["path"], cache_dir, exc)


def _add_source(cache_dir: Path, record: dict[str, object], digest: str) -> None:
    """Under the conversion's lock: its record, with `record` replacing any earlier entry for
    the same path, rewritten atomically (a cache this user cannot write is left as it is)."""
    path = cache_dir / SOURCE_RECORD
    known = _sources(cache_dir)
    sources = [s for s in (known[0] if known else []) if s.get("path") != record["path"]]
    try:
        _replace_record(path, {"sha256": digest, "sources": [*sources, record]})
    except OSError as exc:
        logger.debug("not recording %s as a user of %s: %s", record["path"], cache_dir, exc)


def _replace_record(path: Path, record: dict[str, object]) -> None:
    fd, staging = tempfile.mkstemp(prefix=SOURCE_RECORD + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(staging, path)
    finally:
        Path(staging).unlink(missing_ok=True)


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


def _still_held(source: dict[str, object]) -> bool:
    """Whether a recorded file may still hold the content it was converted from: it is gone
    (perhaps only from this pod's view) or it has its recorded size and mtime."""
    try:
        return source_record(Path(str(source["path"]))) == source
    except OSError:
        return True


def _remove_superseded(kept: Path, record: dict[str, object]) -> None:
    """Remove the conversions beside `kept` that `record`'s file used to have: each that
    records its path and that no recorded file still holds (see the module's docstring), and
    any conversion from before content keys of that path. A process still reading one keeps its
    open files; one converting it now holds its lock, and that conversion is left to it."""
    for other in kept.parent.iterdir():
        if other == kept or not other.is_dir():
            continue
        known = _sources(other)
        if known is None:
            continue  # a staging directory, or a conversion that records no source
        sources, content_keyed = known
        if record["path"] not in {s.get("path") for s in sources}:
            continue
        if content_keyed and any(_still_held(s) for s in sources):
            continue
        try:
            with FileLock(_lock_path(other), timeout=0):
                logger.info("removing %s: converted from an earlier %s", other, record["path"])
                shutil.rmtree(other, ignore_errors=True)
                # nobody asks for this key again: no file holds its content any more
                _lock_path(other).unlink(missing_ok=True)
        except Timeout:
            continue
        except OSError as exc:  # the new conversion stands all the same
            logger.info("could not remove %s: %s", other, exc)
