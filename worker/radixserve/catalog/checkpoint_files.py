"""Where a `--model`'s files are (a path, a GGUF file, a Hub snapshot), which of them hold the
weights, and reading those ahead into the page cache. The loader resolves a model here too.

A cold start reads the weights only once the scheduler process has imported torch and built
the network: on an H200 host that was about 20 s of launch and imports with the disk idle,
then 10 s of reading 16 GB. `start_prefetch` runs the read beside the model's setup instead:
the front end starts it first thing, daemon threads read every weight file once (in the
loader's order, chunk by chunk through a small buffer, nothing kept), and the loader's own
read later finds the pages in memory. The loader reads buffered for this (hf_dir.py).
Torch-free, so the front end can run it before anything heavy is imported.

The read waits until the scheduler process's imports no longer need the disk (`after`: the
front end sets it when that process says it has imported, or when the start-up read-ahead
(read_ahead.py) has put what those imports read in memory): with the page cache dropped, the
imports fault torch's, triton's and CUDA's libraries in from the same disk, and beside a
read-ahead streaming 16 GB they took 28 s on 2026-12-03 against 6-10 s alone
(docs/benchmark-log.md).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from radixserve.catalog.hub import resolve_hub_model
from radixserve.host_memory import available_memory_bytes
from radixserve.read_ahead import Extent, read_extents
from radixserve.server_args import BUILTIN_SMOLLM2, RANDOM_PREFIX

logger = logging.getLogger(__name__)

SAFETENSORS_INDEX = "model.safetensors.index.json"
# Few reads in flight: the imports running meanwhile fault their libraries in from the same
# disk, and on the H200 host (gVisor) they slow down with every reader beside them. 8 readers
# of 8 MB read no faster there than 2 (1.13-1.37 against 0.97-1.35 GB/s: the host's disk
# path is the cap) and made the imports 9.4-14.1 s against 6.0-9.8 (docs/benchmark-log.md,
# 2026-12-01 night).
CHUNK_BYTES = 8 << 20
READ_THREADS = 2
# at most this share of the memory available at start is filled: a checkpoint that does not
# fit would evict its own first files before the loader reached them
MEMORY_SHARE = 0.6


def is_hf_directory(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def safetensors_files(directory: Path) -> list[Path]:
    """The shards named by the index file, or every `*.safetensors` file when there is none."""
    index = directory / SAFETENSORS_INDEX
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return [directory / name for name in sorted(set(weight_map.values()))]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(
            f"{directory} has config.json but no *.safetensors weights "
            "(convert .bin checkpoints with save_pretrained(safe_serialization=True))"
        )
    return files


def tensor_entries(files: list[Path]) -> Iterator[tuple[str, str, int, int]]:
    """(name, stored dtype as safetensors names it, elements, bytes) of every tensor in the
    shards, from their headers alone (an 8-byte length, then JSON)."""
    for file in files:
        with file.open("rb") as shard:
            header = json.loads(shard.read(int.from_bytes(shard.read(8), "little")))
        for name, entry in header.items():
            if name != "__metadata__":
                start, end = entry["data_offsets"]
                yield name, entry["dtype"], math.prod(entry["shape"]), end - start


def local_path(model: str, cached_only: bool = False) -> Path:
    """Where `model`'s files are: a Hub snapshot (only one already in the cache when
    `cached_only`), or the path it names."""
    hub = resolve_hub_model(model, cached_only)
    return hub or Path(model.removeprefix("file://")).expanduser()


def hf_directory_config(model: str) -> dict | None:
    """The raw config.json of `model` where it is a checkpoint directory (a local one or a Hub
    snapshot, fetched if need be), else None (the bundled model, random weights, GGUF)."""
    if model == BUILTIN_SMOLLM2 or model.startswith(RANDOM_PREFIX):
        return None
    path = local_path(model)
    if not is_hf_directory(path):
        return None
    return json.loads((path / "config.json").read_text())


def gguf_file(path: Path) -> Path | None:
    """The GGUF file `path` names, or the one GGUF file in the directory it names."""
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and len(ggufs := sorted(path.glob("*.gguf"))) == 1:
        return ggufs[0]
    return None


def local_weight_files(model: str) -> list[Path]:
    """The weight files the loader will read for `model` where they are already on this
    machine: a directory's shards, a GGUF file, a Hub repository's cached snapshot. Empty for
    anything else (random weights, a repository not in the cache: nothing to read ahead)."""
    if model == BUILTIN_SMOLLM2 or model.startswith(RANDOM_PREFIX):
        return []
    path = local_path(model, cached_only=True)
    if is_hf_directory(path):
        try:
            return safetensors_files(path)
        except ValueError:
            return []  # the loader says why
    gguf = gguf_file(path)
    return [gguf] if gguf else []


def start_prefetch(model: str, after: threading.Event | None = None) -> threading.Thread:
    """Read `model`'s local weight files into the page cache on daemon threads, once `after`
    is set (at once without it); returns the thread that waits for them (it logs what it read
    and how fast)."""
    thread = threading.Thread(
        target=prefetch, args=(model, after), name="weight-prefetch", daemon=True
    )
    thread.start()
    return thread


def prefetch(model: str, after: threading.Event | None = None) -> int:
    """Read the files, at most MEMORY_SHARE of the available memory, in the loader's order,
    once `after` is set; the bytes read."""
    asked = time.perf_counter()
    if after is not None:
        after.wait()
    started = time.perf_counter()
    budget = int(available_memory_bytes() * MEMORY_SHARE)
    extents: list[Extent] = []
    planned = 0
    for file in local_weight_files(model):
        size = file.stat().st_size
        if planned + size > budget:
            break
        planned += size
        extents.append(Extent(file, 0, size))
    if not extents:
        return 0
    read = read_extents(extents, READ_THREADS, CHUNK_BYTES)
    elapsed = time.perf_counter() - started
    logger.info(
        "read %.1f GB of weights ahead in %.1fs (%.2f GB/s), after %.1fs waiting for the disk",
        read / 1e9,
        elapsed,
        read / 1e9 / max(elapsed, 1e-9),
        started - asked,
    )
    return read
