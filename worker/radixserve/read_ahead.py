"""Reading files into the page cache before the process that needs them asks: the chunked
readers both read-aheads use, and the record of what a scheduler process's start-up read.

A cold start is disk-bound twice over. The scheduler process's imports fault in torch's, CUDA's
and triton's shared libraries page by page, one fault at a time, and its bytecode file by file
(on the H200 host with the page cache dropped: 9 s of imports against 5.6 s warm, 2026-12-04);
only then does the weight read-ahead get the disk, since beside it those faults crawl (15 s).
Most of those pages are known in advance: the scheduler process records, once it has started,
which files it opened for reading, in order (its bytecode, and what it reads without importing:
transformers' scan of its 1,700 model sources for `AutoConfig`, configs, the kernel caches; from
Python's "open" audit event, watched from the spawn's first line), and which pages of each
shared library its own page table holds (/proc/self/pagemap: what it touched, 0.2 of the 1.07
GB of libraries on a CPU machine; without one, the pages of its mappings in the page cache,
less the CUDA fatbins), in the order it loaded them. The next start's front end reads those
ranges on a few threads the moment it has spawned the scheduler, so the imports find their
pages in memory; and the weight read-ahead may begin as soon as that read is done, not when
the imports are.

Torch-free, and imports nothing of radixserve but the leaves `server_args` and `host_memory`,
so the front end runs it before anything heavy is imported.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import queue
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from radixserve.host_memory import available_memory_bytes
from radixserve.server_args import cache_root

logger = logging.getLogger(__name__)

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# touched ranges closer than this are read as one: a few pages more in one request cost less
# than a second request
MERGE_GAP_BYTES = 256 << 10
# the start-up read's readers: most of its files are small (a thousand bytecode files), where a
# read is its latency, so more than the weights' two
STARTUP_READ_THREADS = 4
STARTUP_CHUNK_BYTES = 8 << 20  # the largest read a reader makes: its buffer
# of the memory available at start: a record larger than this (a small pod) is read only so far
STARTUP_MEMORY_SHARE = 0.25
RECORD_VERSION = 1
# a file opened at start-up larger than this is not read ahead whole (a GGUF checkpoint that
# gguf maps: the weights' own read-ahead has it)
OPENED_FILE_MAX_BYTES = 64 << 20
# the kernel's files (/proc/self/maps is "regular"): not on a disk, and per process
_KERNEL_FILES = ("/proc/", "/sys/", "/dev/")


class Extent(NamedTuple):
    """`length` bytes of `path` from `offset`."""

    path: Path
    offset: int
    length: int


def read_extents(extents: Iterable[Extent], threads: int, chunk_bytes: int) -> int:
    """Read the extents once, in order, in pieces of at most `chunk_bytes` through one small
    buffer per reader, on `threads` daemon threads (nothing is kept: the point is the page
    cache); the bytes read. A file that cannot be opened, or is not a regular file (a FIFO
    would block a reader for good), is skipped: its reader will meet it and say why."""
    pieces: queue.SimpleQueue[Extent | None] = queue.SimpleQueue()
    for path, offset, length in extents:
        for at in range(offset, offset + length, chunk_bytes):
            pieces.put(Extent(path, at, min(chunk_bytes, offset + length - at)))
    counts = [0] * threads
    readers = [
        threading.Thread(target=_read_pieces, args=(pieces, counts, i, chunk_bytes), daemon=True)
        for i in range(threads)
    ]
    for reader in readers:
        pieces.put(None)  # one end mark per reader
        reader.start()
    for reader in readers:
        reader.join()
    return sum(counts)


def _read_pieces(
    pieces: queue.SimpleQueue[Extent | None], counts: list[int], slot: int, chunk_bytes: int
) -> None:
    buffer = memoryview(bytearray(chunk_bytes))
    descriptors: dict[Path, int | None] = {}
    try:
        while (piece := pieces.get()) is not None:
            if piece.path not in descriptors:
                descriptors[piece.path] = _open_regular(piece.path)
            fd = descriptors[piece.path]
            if fd is None:
                continue
            try:
                counts[slot] += os.preadv(fd, [buffer[: piece.length]], piece.offset)
            except OSError as exc:  # its reader will meet the same error and say why
                logger.debug("read-ahead skips %s from %d: %s", piece.path, piece.offset, exc)
    finally:
        for fd in descriptors.values():
            if fd is not None:
                os.close(fd)


def _open_regular(path: Path) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        logger.debug("read-ahead skips %s: %s", path, exc)
        return None
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    os.close(fd)
    return None


# ------------------------------------------------------------------ the start-up record


def startup_record_path() -> Path:
    """Where this interpreter's start-up record lives: one per Python (its libraries and
    bytecode are its own), under the worker's cache (on Kubernetes the model-cache volume, so
    a node's next pod finds it)."""
    python = f"{os.path.realpath(sys.executable)}\0{os.path.realpath(sys.prefix)}"
    key = hashlib.sha256(python.encode()).hexdigest()[:16]
    return cache_root() / "startup" / f"{key}.json"


# the regular files this process opened for reading since `watch_opened_files`, in order
_opened_files: dict[str, None] = {}
_watching_opens = False


def watch_opened_files() -> None:
    """Note, from now until `record_startup_files`, every file this process opens for reading
    (Python's "open" audit event: `open`, `io.open_code` for bytecode, `os.open`), in order.
    Called first thing in the scheduler process, before its imports. An audit hook cannot be
    removed; once recording is done it returns at its first test."""
    global _watching_opens
    if _watching_opens:
        return
    _watching_opens = True

    def on_event(event: str, args: tuple) -> None:
        if not _watching_opens or event != "open":
            return
        name, _, flags = args  # (path, mode, open(2) flags)
        if isinstance(name, str) and isinstance(flags, int) and not flags & os.O_ACCMODE:
            _opened_files.setdefault(os.path.abspath(name))  # read-only: O_RDONLY is 0

    sys.addaudithook(on_event)


def record_startup_files(path: Path | None = None) -> int:
    """Record what this process read to start, for the next start's read-ahead: the files it
    opened for reading since `watch_opened_files` (in order: mostly small, and each a wait of
    its own), every imported module's bytecode file not among them, then the touched ranges of
    every shared library it loaded (in load order), each file with its size and mtime. Written
    atomically; the bytes recorded. Never raises: a start must not fail for its record. Ends
    the watch."""
    global _watching_opens
    _watching_opens = False
    path = path or startup_record_path()
    try:
        files = [*_read_files(), *_touched_libraries()]
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(json.dumps({"version": RECORD_VERSION, "files": files}))
        os.replace(partial, path)
    except Exception as exc:  # a read-only cache, a /proc without maps, a racing writer
        logger.debug("start-up files not recorded: %s", exc)
        return 0
    return sum(length for entry in files for _, length in entry["ranges"])


def recorded_extents(budget_bytes: int, path: Path | None = None) -> list[Extent]:
    """The recorded ranges of the files that are still as recorded (same size and mtime), in
    the record's order, at most `budget_bytes` of them; empty without a usable record."""
    try:
        record = json.loads((path or startup_record_path()).read_text())
        if record.get("version") != RECORD_VERSION:
            return []
        extents: list[Extent] = []
        total = 0
        for entry in record["files"]:
            file = Path(entry["path"])
            try:
                now = file.stat()
            except OSError:
                continue
            if (now.st_size, now.st_mtime_ns) != (entry["size"], entry["mtime_ns"]):
                continue
            for offset, length in entry["ranges"]:
                offset, length = int(offset), min(int(length), now.st_size - int(offset))
                if length <= 0:
                    continue
                if total + length > budget_bytes:
                    return extents
                extents.append(Extent(file, offset, length))
                total += length
        return extents
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.debug("no usable start-up record: %s", exc)
        return []


def start_startup_read_ahead(done: threading.Event) -> threading.Thread:
    """Read the recorded start-up ranges (at most STARTUP_MEMORY_SHARE of the memory available
    now) on daemon threads; set `done` once they are read, where there were any (without a
    record the caller's other signal must open its gate)."""

    def run() -> None:
        started = time.perf_counter()
        extents = recorded_extents(int(available_memory_bytes() * STARTUP_MEMORY_SHARE))
        if not extents:
            return
        read = read_extents(extents, STARTUP_READ_THREADS, STARTUP_CHUNK_BYTES)
        done.set()
        logger.info(
            "read %.2f GB of start-up files ahead in %.1fs (the files and library pages the "
            "last start read)",
            read / 1e9,
            time.perf_counter() - started,
        )

    thread = threading.Thread(target=run, name="startup-read-ahead", daemon=True)
    thread.start()
    return thread


def _touched_libraries() -> list[dict]:
    """Each loaded shared library (the dynamic linker's load order) with the ranges of it this
    start touched: the pages this process's page table holds (/proc/self/pagemap), else those
    of its mappings in the page cache (mincore: after a start with the cache dropped, what that
    start read), else whole files (a kernel with neither, or one that reports nothing). Only
    pagemap says what was touched: gVisor (the H200 host's sandbox) may have no pagemap, and
    its mincore calls every mapped page resident. So from the other two, a library's CUDA fatbin
    sections are left out: most of CUDA's libraries' bytes (cuBLASLt's, NCCL's, cuFFT's device
    code), which the driver reads kernel by kernel when one is first used, not at import."""
    libraries = _loaded_libraries()
    touched: dict[str, list[tuple[int, int]]] = {}
    exact = False
    for source in (_pagemap_present, _mincore_resident):
        try:
            touched = _mapped_ranges(source, set(libraries))
        except OSError as exc:
            logger.debug("start-up record: %s unavailable (%s)", source.__name__, exc)
        if touched:
            exact = source is _pagemap_present
            break
    entries = []
    for library in libraries:
        if not touched:
            ranges = [(0, os.path.getsize(library))]
        elif not (ranges := touched.get(library, [])):
            continue
        if not exact:
            ranges = _without(ranges, _fatbin_sections(library))
        if ranges:
            entries.append(_entry(library, _merged(ranges)))
    return entries


FATBIN_SECTIONS = (b".nv_fatbin", b"__nv_relfatbin")


def _fatbin_sections(path: str) -> list[tuple[int, int]]:
    """The (file offset, size) of the ELF file's CUDA fatbin sections, from its section headers
    (ELF64, little-endian); none for anything else or a file that cannot be read."""
    try:
        with open(path, "rb") as elf:
            header = elf.read(64)
            if header[:6] != b"\x7fELF\x02\x01":  # 64-bit, little-endian
                return []
            (shoff,) = struct.unpack_from("<Q", header, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from("<HHH", header, 0x3A)
            if shentsize < 64 or not shnum or shstrndx >= shnum:
                return []
            elf.seek(shoff)
            table = elf.read(shentsize * shnum)
            sections = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
            names_at, names_size = sections[shstrndx][4], sections[shstrndx][5]
            elf.seek(names_at)
            names = elf.read(names_size)
    except (OSError, struct.error):
        return []
    found = []
    for name_at, kind, _flags, _addr, offset, size in sections:
        name = names[name_at : names.find(b"\0", name_at)]
        if name in FATBIN_SECTIONS and kind != 8:  # SHT_NOBITS occupies no file bytes
            found.append((offset, size))
    return found


def _without(ranges: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`ranges` (offset, length) less the bytes of `holes`, each hole's edges rounded inwards
    to pages (the ranges are pages)."""
    for hole_at, hole_size in holes:
        first = -(-hole_at // PAGE_BYTES) * PAGE_BYTES
        end = (hole_at + hole_size) // PAGE_BYTES * PAGE_BYTES
        if end <= first:
            continue
        kept = []
        for offset, length in ranges:
            if offset < first:
                kept.append((offset, min(offset + length, first) - offset))
            if offset + length > end:
                kept.append((max(offset, end), offset + length - max(offset, end)))
        ranges = kept
    return ranges


def _read_files() -> list[dict]:
    """The opened files (regular, at most OPENED_FILE_MAX_BYTES; libraries come with their
    pages), then the imported modules' bytecode files not among them (what the spawn's own
    bootstrap imported before the watch began), whole."""
    bytecode = (
        getattr(getattr(module, "__spec__", None), "cached", None)
        for module in list(sys.modules.values())
    )
    entries, seen = [], set()
    for name in [*_opened_files, *bytecode]:
        if (
            not name
            or name in seen
            or name.startswith(_KERNEL_FILES)
            or ".so" in os.path.basename(name)
        ):
            continue
        seen.add(name)
        try:
            now = os.stat(name)
        except OSError:
            continue
        if stat.S_ISREG(now.st_mode) and now.st_size <= OPENED_FILE_MAX_BYTES:
            entries.append(_entry(name, now=now))
    return entries


def _entry(
    path: str, ranges: Sequence[tuple[int, int]] | None = None, now: os.stat_result | None = None
) -> dict:
    """A record's line for one file: its size and mtime now (`now`, where the caller has
    them), and its ranges (the whole file without any)."""
    now = now or os.stat(path)
    return {
        "path": path,
        "size": now.st_size,
        "mtime_ns": now.st_mtime_ns,
        "ranges": [list(r) for r in ranges] if ranges is not None else [[0, now.st_size]],
    }


def _loaded_libraries() -> list[str]:
    """The shared objects the dynamic linker has loaded, in load order (dl_iterate_phdr), each
    by its real path."""

    class PhdrInfo(ctypes.Structure):
        _fields_ = [("dlpi_addr", ctypes.c_void_p), ("dlpi_name", ctypes.c_char_p)]

    names: list[str] = []

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(PhdrInfo), ctypes.c_size_t, ctypes.c_void_p)
    def visit(info, _size, _data):  # type: ignore[no-untyped-def]
        if name := info.contents.dlpi_name:
            names.append(name.decode(errors="surrogateescape"))
        return 0

    ctypes.CDLL(None).dl_iterate_phdr(visit, None)
    order = dict.fromkeys(os.path.realpath(n) for n in names if os.path.isfile(n))
    return list(order)


def _mapped_ranges(
    pages_in: Callable[[int, int], Any], files: set[str]
) -> dict[str, list[tuple[int, int]]]:
    """For each of `files` this process maps, the file ranges (offset, length) of its pages
    that `pages_in(start address, page count)` (a boolean array a page) says are in. Only
    those files' mappings are asked about: not a memory-mapped checkpoint's gigabytes, nor a
    device's mappings (mincore refuses those)."""
    import numpy as np  # the scheduler process has it; the front end never records

    ranges: dict[str, list[tuple[int, int]]] = {}
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or not fields[5].startswith("/"):
                continue
            file = os.path.realpath(fields[5].rstrip("\n"))
            if file not in files:
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            present = np.flatnonzero(pages_in(start, (end - start) // PAGE_BYTES))
            if not present.size:
                continue
            # runs of consecutive pages, as file offsets
            breaks = np.flatnonzero(np.diff(present) != 1)
            firsts = np.concatenate(([present[0]], present[breaks + 1]))
            lasts = np.concatenate((present[breaks], [present[-1]]))
            base = int(fields[2], 16)
            ranges.setdefault(file, []).extend(
                (base + int(a) * PAGE_BYTES, int(b - a + 1) * PAGE_BYTES)
                for a, b in zip(firsts, lasts, strict=True)
            )
    return ranges


def _pagemap_present(start: int, pages: int) -> Any:
    """Which of the pages from `start` this process's page table holds: bit 63 of their
    /proc/self/pagemap entries (readable without privileges; the frame numbers are not)."""
    import numpy as np

    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(start // PAGE_BYTES * 8)
        entries = np.frombuffer(pagemap.read(pages * 8), dtype="<u8")
    return (entries >> np.uint64(63)).astype(bool)


def _mincore_resident(start: int, pages: int) -> Any:
    """Which of the pages from `start` (a mapping of this process) are in the page cache."""
    import numpy as np

    vector = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    if libc.mincore(start, pages * PAGE_BYTES, vector) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return np.frombuffer(vector, dtype=np.uint8) & 1 == 1


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ranges sorted, with overlapping ones and those less than MERGE_GAP_BYTES apart
    joined."""
    merged: list[list[int]] = []
    for offset, length in sorted(ranges):
        if merged and offset <= merged[-1][0] + merged[-1][1] + MERGE_GAP_BYTES:
            merged[-1][1] = max(merged[-1][1], offset + length - merged[-1][0])
        else:
            merged.append([offset, length])
    return [(offset, length) for offset, length in merged]
