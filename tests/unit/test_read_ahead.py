"""The start-up read-ahead: what a scheduler process records of its start, what the next start
reads back from that record, and the chunked reader both read-aheads use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from radixserve import read_ahead
from radixserve.read_ahead import (
    MERGE_GAP_BYTES,
    PAGE_BYTES,
    Extent,
    read_extents,
    record_startup_files,
    recorded_extents,
    start_startup_read_ahead,
)

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/maps").exists(), reason="the record reads /proc/self/maps"
)


def record(tmp_path: Path) -> list[dict]:
    path = tmp_path / "record.json"
    assert record_startup_files(path) > 0
    return json.loads(path.read_text())["files"]


def test_the_record_holds_the_bytecode_then_the_touched_libraries(tmp_path):
    import numpy  # noqa: F401  (a shared library this process has surely touched)

    files = record(tmp_path)
    kinds = ["so" if ".so" in Path(f["path"]).name else "pyc" for f in files]
    assert "pyc" in kinds and "so" in kinds
    assert kinds == sorted(kinds)  # every bytecode file before the first library
    assert any(f["path"] == read_ahead.__spec__.cached for f in files) == os.path.isfile(
        read_ahead.__spec__.cached
    )
    libraries = [f for f in files if ".so" in Path(f["path"]).name]
    assert any("numpy" in f["path"] for f in libraries)
    for entry in libraries:
        assert os.stat(entry["path"]).st_size == entry["size"]
        ends = 0
        for offset, length in entry["ranges"]:
            assert offset % PAGE_BYTES == 0 and length > 0
            assert offset >= ends + MERGE_GAP_BYTES or ends == 0  # merged where closer
            ends = offset + length
        # the touched pages only: the page table's, never past the file's last page
        assert ends <= entry["size"] + PAGE_BYTES
    touched = sum(length for f in libraries for _, length in f["ranges"])
    assert touched < sum(f["size"] for f in libraries)  # not every page of every library


def no_source(start, pages):
    raise PermissionError("not here")


def test_without_a_page_table_the_page_cache_says_what_was_read(tmp_path, monkeypatch):
    """mincore's pages (in the page cache) include every page this process maps (pagemap's):
    the fallback records at least what the page table would have (compared unmerged: a merge
    across a gap the page table skipped may span pages the cache does not hold)."""
    monkeypatch.setattr(read_ahead, "MERGE_GAP_BYTES", 0)
    touched = {f["path"]: f["ranges"] for f in record(tmp_path) if ".so" in Path(f["path"]).name}
    monkeypatch.setattr(read_ahead, "_pagemap_present", no_source)
    cached = {f["path"]: f["ranges"] for f in record(tmp_path) if ".so" in Path(f["path"]).name}
    assert set(cached) >= set(touched)
    for path, ranges in touched.items():
        for offset, length in ranges:  # each touched range lies inside one cached range
            assert any(o <= offset and offset + length <= o + n for o, n in cached[path]), path


def test_with_neither_whole_libraries_are_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(read_ahead, "_pagemap_present", no_source)
    monkeypatch.setattr(read_ahead, "_mincore_resident", no_source)
    libraries = [f for f in record(tmp_path) if ".so" in Path(f["path"]).name]
    assert libraries
    assert all(f["ranges"] == [[0, f["size"]]] for f in libraries)


def test_a_record_that_cannot_be_written_does_not_fail_the_start(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert record_startup_files(blocker / "under-a-file.json") == 0


def write_record(path: Path, files: list[tuple[Path, list[list[int]]]]) -> Path:
    entries = []
    for file, ranges in files:
        now = file.stat()
        entries.append(
            {"path": str(file), "size": now.st_size, "mtime_ns": now.st_mtime_ns, "ranges": ranges}
        )
    path.write_text(json.dumps({"version": read_ahead.RECORD_VERSION, "files": entries}))
    return path


def test_only_files_still_as_recorded_are_read_back_within_the_budget(tmp_path):
    a, b, c, gone = (tmp_path / n for n in "abcd")
    for file, size in ((a, 5000), (b, 100), (c, 3000), (gone, 10)):
        file.write_bytes(b"x" * size)
    path = write_record(
        tmp_path / "r.json",
        [(a, [[0, 1000], [4096, 8192]]), (b, [[0, 100]]), (c, [[0, 3000]]), (gone, [[0, 10]])],
    )
    b.write_bytes(b"y" * 101)  # changed since: skipped
    gone.unlink()
    assert recorded_extents(10_000, path) == [
        Extent(a, 0, 1000),
        Extent(a, 4096, 904),  # clipped to the file
        Extent(c, 0, 3000),
    ]
    assert recorded_extents(2000, path) == [Extent(a, 0, 1000), Extent(a, 4096, 904)]
    assert recorded_extents(999, path) == []


@pytest.mark.parametrize("content", ["not json", '{"version": 0, "files": []}', '{"files": 3}'])
def test_an_unusable_record_reads_nothing(tmp_path, content):
    path = tmp_path / "r.json"
    path.write_text(content)
    assert recorded_extents(1 << 30, path) == []
    assert recorded_extents(1 << 30, tmp_path / "missing.json") == []


def test_every_byte_of_the_extents_is_read_and_nothing_blocks(tmp_path):
    data = tmp_path / "data"
    data.write_bytes(os.urandom(10_000))
    fifo = tmp_path / "fifo"  # a reader opening it for reading would wait for a writer
    os.mkfifo(fifo)
    extents = [
        Extent(data, 0, 10_000),
        Extent(fifo, 0, 100),
        Extent(tmp_path / "missing", 0, 100),
        Extent(data, 9_000, 1_000),
    ]
    reader = threading.Thread(target=lambda: out.append(read_extents(extents, 3, 999)))
    out: list[int] = []
    reader.start()
    reader.join(timeout=30)
    assert out == [11_000]


def test_the_gate_opens_once_the_recorded_files_are_read(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path))
    done = threading.Event()
    start_startup_read_ahead(done).join(timeout=30)
    assert not done.is_set()  # no record yet: the scheduler's imports open the gate

    lib = tmp_path / "lib.so"
    lib.write_bytes(b"z" * 50_000)
    read_ahead.startup_record_path().parent.mkdir(parents=True)
    write_record(read_ahead.startup_record_path(), [(lib, [[0, 50_000]])])
    seen: list[list[Extent]] = []
    real_read = read_ahead.read_extents
    monkeypatch.setattr(
        read_ahead, "read_extents", lambda e, *a: seen.append(e) or real_read(e, *a)
    )
    start_startup_read_ahead(done).join(timeout=30)
    assert done.is_set()
    assert seen == [[Extent(lib, 0, 50_000)]]


def test_the_record_is_per_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path))
    mine = read_ahead.startup_record_path()
    assert mine.parent == tmp_path / "startup"
    monkeypatch.setattr(sys, "executable", "/another/python")
    assert read_ahead.startup_record_path() != mine


def a_library() -> Path:
    import numpy

    return next(Path(numpy.__file__).parent.rglob("_multiarray_umath*.so"))


def test_a_fatbin_section_is_found_by_its_name(tmp_path):
    """A real library with one section renamed `.nv_fatbin` in its section-name table (as
    CUDA's libraries carry their device code): that section's bytes, and none in the
    original or in a file that is not ELF."""
    original = a_library()
    assert read_ahead._fatbin_sections(str(original)) == []
    data = bytearray(original.read_bytes())
    at = data.find(b"\0.init_array\0") + 1
    assert at > 0
    data[at : at + 12] = b".nv_fatbin\0\0"  # same offsets for every other name
    renamed = tmp_path / "lib.so"
    renamed.write_bytes(bytes(data))
    ((offset, size),) = read_ahead._fatbin_sections(str(renamed))
    assert offset > 0 and size > 0 and offset + size <= len(data)
    other = bytearray(original.read_bytes())
    at_text = other.find(b"\0.text\0") + 1
    other[at_text : at_text + 6] = b"__nv_r"  # not a fatbin name: nothing
    (tmp_path / "other.so").write_bytes(bytes(other))
    assert read_ahead._fatbin_sections(str(tmp_path / "other.so")) == []
    (tmp_path / "text.so").write_text("not an ELF file")
    assert read_ahead._fatbin_sections(str(tmp_path / "text.so")) == []


def test_ranges_less_a_hole_keep_whole_pages_around_it():
    page = PAGE_BYTES
    ranges = [(0, 10 * page), (20 * page, 2 * page), (30 * page, 5 * page)]
    # a hole from inside page 2 to inside page 8 takes pages 3..7; one over pages 20-21 all
    hole = [(2 * page + 1, 6 * page), (19 * page, 4 * page)]
    assert read_ahead._without(ranges, hole) == [
        (0, 3 * page),
        (8 * page, 2 * page),
        (30 * page, 5 * page),
    ]
    assert read_ahead._without(ranges, [(5, 10)]) == ranges  # inside one page: nothing out


def test_without_a_page_table_fatbins_are_left_out(tmp_path, monkeypatch):
    """From mincore or whole files (not what was touched: gVisor's mincore calls every page
    resident), a library's fatbin sections are not recorded; from pagemap they may be."""
    library = str(a_library().resolve())
    page = PAGE_BYTES
    monkeypatch.setattr(
        read_ahead, "_fatbin_sections", lambda p: [(page, 4 * page)] if p == library else []
    )
    monkeypatch.setattr(read_ahead, "MERGE_GAP_BYTES", 0)

    def ranges_of(files):
        return next(f["ranges"] for f in files if f["path"] == library)

    monkeypatch.setattr(read_ahead, "_pagemap_present", no_source)
    cached = ranges_of(record(tmp_path))
    assert all(o + n <= page or o >= 5 * page for o, n in cached), cached
    monkeypatch.setattr(read_ahead, "_mincore_resident", no_source)
    whole = ranges_of(record(tmp_path))
    assert whole == [[0, page], [5 * page, os.path.getsize(library) - 5 * page]]


WATCHED_START = """
import json, os, sys
from pathlib import Path
from radixserve import read_ahead
read_ahead.watch_opened_files()
directory = Path(sys.argv[1])
(directory / "config.json").read_text()  # read, never imported
(directory / "written.txt").write_text("x")  # opened for writing: not a read
(directory / "both.txt").write_text("x")
open(directory / "both.txt", "r+").close()
open("/proc/self/maps").read()  # the kernel's, per process
sys.path.insert(0, str(directory))
import planted_module
read_ahead.record_startup_files(directory / "record.json")
(directory / "after.json").read_text()  # after the record: the watch has ended
print(json.dumps([f["path"] for f in json.loads((directory / "record.json").read_text())["files"]]))
print(json.dumps(sorted(read_ahead._opened_files)))
"""


def test_a_watched_start_records_the_files_it_read_in_order(tmp_path):
    """A process that watches from its first line records what it opened for reading, in
    order, whether imported or only read (a module's source, a config), and not what it wrote,
    the kernel's files, or what it opened after the record."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "after.json").write_text("{}")
    (tmp_path / "planted_module.py").write_text("VALUE = 1\n")
    env = {**os.environ, "PYTHONPATH": str(Path(read_ahead.__file__).parents[1])}
    run = subprocess.run(
        [sys.executable, "-c", WATCHED_START, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    recorded, opened = (json.loads(line) for line in run.stdout.splitlines()[-2:])
    config, source = str(tmp_path / "config.json"), str(tmp_path / "planted_module.py")
    assert config in recorded and source in recorded
    assert recorded.index(config) < recorded.index(source)  # in the order they were read
    for absent in ("written.txt", "both.txt", "after.json"):
        assert str(tmp_path / absent) not in recorded
    assert str(tmp_path / "after.json") not in opened
    assert not [p for p in recorded if p.startswith("/proc/")]
