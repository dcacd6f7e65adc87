"""The conversion cache: one conversion per file, written atomically, and the conversions of a
file that has since changed at its path removed when the new one is written."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from filelock import FileLock

from radixserve.model_loader import conversion_cache
from radixserve.model_loader.conversion_cache import SOURCE_RECORD, converted_once


def convert(source: Path, cache: Path, version: str = "1") -> Path:
    """A stand-in conversion: the source's bytes reversed, kept in `cache`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RADIXSERVE_CACHE_DIR", str(cache.parent))
        done = converted_once(
            cache.name,
            source,
            version,
            write=lambda staging: (staging / "converted").write_bytes(source.read_bytes()[::-1]),
            complete=lambda d: (d / "converted").is_file(),
            what=source.name,
        )
    assert done is not None and done.parent == cache
    return done


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
        "path": str(source.resolve()),
        "size": 7,
        "mtime_ns": source.stat().st_mtime_ns,
    }
    assert convert(source, tmp_path / "cache") == first


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
