"""The conversion cache: one conversion per file content, written atomically and shared by every
path that holds that content (two clones, a reinstalled virtualenv), and the conversions of a
content no recorded file holds any more removed when the new one is written."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest
from filelock import FileLock

from radixserve.model_loader import conversion_cache
from radixserve.model_loader.conversion_cache import (
    DIGESTS,
    SOURCE_RECORD,
    content_digest,
    converted_once,
)


@pytest.fixture(autouse=True)
def no_remembered_digests() -> None:
    """Each test starts with no digest remembered in this process (only its sidecars count)."""
    conversion_cache._digest.cache_clear()


def convert(source: Path, cache: Path, version: str = "1", writes: list | None = None) -> Path:
    """A stand-in conversion: the source's bytes reversed, kept in `cache` (each write is
    appended to `writes`)."""

    def write(staging: Path) -> None:
        if writes is not None:
            writes.append(source)
        (staging / "converted").write_bytes(source.read_bytes()[::-1])

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RADIXSERVE_CACHE_DIR", str(cache.parent))
        done = converted_once(
            cache.name,
            source,
            version,
            write=write,
            complete=lambda d: (d / "converted").is_file(),
            what=source.name,
        )
    assert done is not None and done.parent == cache
    return done


def sources_of(conversion: Path) -> list[str]:
    return [s["path"] for s in json.loads((conversion / SOURCE_RECORD).read_text())["sources"]]


def rewrite(source: Path, content: bytes) -> None:
    """The file replaced at its path, its mtime surely different."""
    before = source.stat().st_mtime_ns
    source.write_bytes(content)
    os.utime(source, ns=(before + 10**9, before + 10**9))


def test_a_conversion_records_its_source_and_is_read_back(tmp_path: Path) -> None:
    source = tmp_path / "model.gguf"
    source.write_bytes(b"weights")
    first = convert(source, tmp_path / "cache")
    assert (first / "converted").read_bytes() == b"sthgiew"
    record = json.loads((first / SOURCE_RECORD).read_text())
    assert record == {
        "sha256": hashlib.sha256(b"weights").hexdigest(),
        "sources": [
            {"path": str(source.resolve()), "size": 7, "mtime_ns": source.stat().st_mtime_ns}
        ],
    }
    assert convert(source, tmp_path / "cache") == first


def test_copies_of_one_file_at_other_paths_share_one_conversion(tmp_path: Path) -> None:
    """Two clones (or a virtualenv rebuilt in place, a new mtime) convert the bundled model once
    between them: the key is the content, and the conversion records every file it served."""
    cache, writes = tmp_path / "cache", []
    clones = [tmp_path / name / "model.gguf" for name in ("clone-a", "clone-b")]
    for clone in clones:
        clone.parent.mkdir()
        clone.write_bytes(b"the same weights")
    shared = {convert(clone, cache, writes=writes) for clone in clones}
    assert len(shared) == 1 and writes == clones[:1]
    (conversion,) = shared
    assert sources_of(conversion) == [str(c.resolve()) for c in clones]
    rewrite(clones[0], b"the same weights")  # touched: another mtime, the same bytes
    assert convert(clones[0], cache, writes=writes) == conversion and len(writes) == 1
    assert sorted(sources_of(conversion)) == sorted(str(c.resolve()) for c in clones)


def test_a_files_digest_is_remembered_until_the_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sha256 is read back from a sidecar (a new process: nothing remembered in memory), not
    computed at every start; a file with another size or mtime is hashed again."""
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "model.gguf"
    source.write_bytes(b"version one")
    hashed = []
    file_digest = hashlib.file_digest

    def counting(f, digest):
        hashed.append(f.name)
        return file_digest(f, digest)

    monkeypatch.setattr(conversion_cache.hashlib, "file_digest", counting)
    assert content_digest(source) == hashlib.sha256(b"version one").hexdigest()
    conversion_cache._digest.cache_clear()
    assert content_digest(source) == hashlib.sha256(b"version one").hexdigest()
    assert len(hashed) == 1
    assert len(list((tmp_path / "cache" / DIGESTS).iterdir())) == 1
    rewrite(source, b"version two")
    assert content_digest(source) == hashlib.sha256(b"version two").hexdigest()
    assert len(hashed) == 2


def test_a_shared_conversion_stays_while_another_file_still_holds_its_content(
    tmp_path: Path,
) -> None:
    """Clone A upgrades its model: the old content's conversion stays, clone B still reads it;
    once B upgrades too, nothing holds the old content and its conversion goes."""
    cache = tmp_path / "cache"
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    for clone in (a, b):
        clone.write_bytes(b"version one")
    old = convert(a, cache)
    assert convert(b, cache) == old
    rewrite(a, b"version two")
    new = convert(a, cache)
    assert old.exists() and new.exists()
    rewrite(b, b"version two")
    assert convert(b, cache) == new
    assert not old.exists() and sorted(sources_of(new)) == sorted([str(a), str(b)])


def test_a_conversion_keyed_by_path_from_before_is_removed(tmp_path: Path) -> None:
    """A cache written before content keys holds a conversion per path (0.5 GB each): the
    content-keyed conversion of that path replaces it."""
    cache = tmp_path / "cache"
    source = tmp_path / "model.gguf"
    source.write_bytes(b"weights")
    path_keyed = cache / "0123456789abcdef"
    path_keyed.mkdir(parents=True)
    record = {"path": str(source.resolve()), "size": 7, "mtime_ns": source.stat().st_mtime_ns}
    (path_keyed / SOURCE_RECORD).write_text(json.dumps(record))
    other_file = cache / "fedcba9876543210"
    other_file.mkdir()
    (other_file / SOURCE_RECORD).write_text(json.dumps(record | {"path": "/elsewhere.gguf"}))
    convert(source, cache)
    assert not path_keyed.exists() and other_file.exists()


def test_a_file_changed_at_its_path_leaves_only_its_new_conversion(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    source = tmp_path / "model.gguf"
    source.write_bytes(b"version one")
    old = convert(source, cache)
    rewrite(source, b"version two!")
    new = convert(source, cache)
    assert new != old and (new / "converted").read_bytes() == b"!owt noisrev"
    assert not old.exists() and not old.with_name(old.name + ".lock").exists()
    assert sorted(p.name for p in cache.iterdir()) == [new.name, new.name + ".lock"]


def test_other_files_and_gone_files_and_other_versions_keep_their_conversions(
    tmp_path: Path,
) -> None:
    """Only a changed file's conversions go: another file's stay, a deleted file's stay (a
    shared cache may serve pods that mount it), and so do the same file's under another
    converter version (an older worker in a rolling update still reads them)."""
    cache = tmp_path / "cache"
    sources = {name: tmp_path / f"{name}.gguf" for name in ("changed", "other", "deleted")}
    for name, source in sources.items():
        source.write_bytes(name.encode())
    other = convert(sources["other"], cache)
    deleted = convert(sources["deleted"], cache)
    older_version = convert(sources["changed"], cache, "converter-1")
    sources["deleted"].unlink()
    convert(sources["changed"], cache, "converter-2")
    assert other.exists() and deleted.exists() and older_version.exists()
    rewrite(sources["changed"], b"changed again")
    newest = convert(sources["changed"], cache, "converter-2")
    assert not older_version.exists()
    assert other.exists() and deleted.exists() and newest.exists()


def test_a_superseded_conversion_someone_holds_the_lock_of_is_left_to_them(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    source = tmp_path / "model.gguf"
    source.write_bytes(b"version one")
    old = convert(source, cache)
    rewrite(source, b"version two")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with FileLock(old.with_name(old.name + ".lock")):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        new = convert(source, cache)
    finally:
        release.set()
        holder.join()
    assert old.exists() and new.exists()


@pytest.mark.parametrize("junk", ["staging", "unreadable-record"])
def test_directories_without_a_readable_record_are_left_alone(tmp_path: Path, junk: str) -> None:
    """A writer's staging directory (no record yet) and a conversion from before records."""
    cache = tmp_path / "cache"
    source = tmp_path / "model.gguf"
    source.write_bytes(b"version one")
    stray = cache / junk
    stray.mkdir(parents=True)
    if junk == "unreadable-record":
        (stray / SOURCE_RECORD).write_text("{not json")
    convert(source, cache)
    rewrite(source, b"version two")
    convert(source, cache)
    assert stray.is_dir()


def test_a_superseded_conversion_that_cannot_be_removed_leaves_the_new_one_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Removing is housekeeping: when it fails (a lock that cannot be taken, a file that will
    not go), the conversion just written is still what the caller reads."""
    cache = tmp_path / "cache"
    source = tmp_path / "model.gguf"
    source.write_bytes(b"version one")
    old = convert(source, cache)
    rewrite(source, b"version two")

    rmtree = conversion_cache.shutil.rmtree

    def refuse_the_old_one(path, *args, **kwargs):
        if Path(path) == old:
            raise PermissionError(f"{path}: read-only")
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(conversion_cache.shutil, "rmtree", refuse_the_old_one)
    new = convert(source, cache)  # convert() asserts it is not None
    assert (new / "converted").read_bytes() == b"owt noisrev" and old.exists()
