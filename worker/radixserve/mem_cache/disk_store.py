"""The disk KV tier: fixed-size token blocks in files named by a hash of the token prefix.

A block is `block_tokens` tokens (`BLOCK_TOKENS` by default); its name chains SHA-256 over the previous block's name, an
extra key (the adapter, once adapters exist; empty today) and the block's tokens, starting from
the fingerprint of what the bytes mean (model, dtype, KV layout, block size). So a block's name
stands for its whole prefix, a restarted worker with the same model and settings finds the
blocks an earlier one wrote, and a worker with other settings looks in another directory.

Each file is a SHA-256 of the rest, then a safetensors payload: the block's raw KV bytes (the
host tier's token layout), its tokens and its parent's name, with the fingerprint in the
metadata. A file whose checksum, fingerprint, tokens or parent does not match is deleted and
counted dropped, never served. Files are written by one writer thread, through a temporary
name and an atomic rename; the step loop only queues. The least recently used files go first
when the directory outgrows `--kv-disk-size`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

logger = logging.getLogger(__name__)

# tokens per file: long enough that a file is worth a system call, short enough that a prefix
# shared only in part still finds most of its blocks
BLOCK_TOKENS = 64
_SUFFIX = ".kv"


def fingerprint_of(**fields: Any) -> str:
    """The hex digest naming what a block's bytes mean; any change starts a fresh directory."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


class DiskKVStore:
    """Blocks of raw KV bytes under `root/<fingerprint[:16]>/`, at most `max_bytes` of them."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        max_bytes: int,
        fingerprint: str,
        block_tokens: int = BLOCK_TOKENS,
    ) -> None:
        """`fingerprint` must name `block_tokens` too (fingerprint_of does, given it)."""
        self.block_tokens = block_tokens
        self.fingerprint = fingerprint
        self.max_bytes = max_bytes
        self.dir = Path(root) / fingerprint[:16]
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._index: OrderedDict[str, int] = OrderedDict()  # name -> file bytes, oldest first
        self._total = 0
        self._queued: set[str] = set()
        self.bytes_written = 0
        self.bytes_restored = 0
        self.bytes_dropped = 0
        self._scan()
        self._queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="kv-disk-writer", daemon=True)
        self._writer.start()

    def _scan(self) -> None:
        """Index the files an earlier worker left, oldest first; leftovers of a crash go."""
        entries = []
        for entry in os.scandir(self.dir):
            if entry.name.endswith(".tmp"):
                os.unlink(entry.path)
            elif entry.name.endswith(_SUFFIX):
                stat = entry.stat()
                entries.append((stat.st_mtime, entry.name[: -len(_SUFFIX)], stat.st_size))
        for _, name, size in sorted(entries):
            self._index[name] = size
            self._total += size
        if entries:
            logger.info(
                "disk KV tier: %d blocks (%d MiB) found in %s",
                len(entries),
                self._total >> 20,
                self.dir,
            )

    # --- names -----------------------------------------------------------------------------

    def block_names(self, tokens: Sequence[int], extra_key: bytes = b"") -> list[str]:
        """The names of the whole blocks of `tokens`, in order (each stands for its prefix)."""
        names = []
        parent = self.fingerprint
        size = self.block_tokens
        for end in range(size, len(tokens) + 1, size):
            digest = hashlib.sha256(parent.encode())
            digest.update(extra_key)
            digest.update(array("i", tokens[end - size : end]).tobytes())
            parent = digest.hexdigest()
            names.append(parent)
        return names

    def parent_of(self, names: list[str], i: int) -> str:
        return names[i - 1] if i > 0 else self.fingerprint

    def contains(self, name: str) -> bool:
        """Whether the block is on disk (a queued one is not readable yet)."""
        with self._lock:
            return name in self._index

    def known(self, name: str) -> bool:
        """Whether the block is on disk or queued: nothing to write."""
        with self._lock:
            return name in self._index or name in self._queued

    # --- reading (the step loop, at admission) ---------------------------------------------

    def read(self, name: str, parent: str, tokens: Sequence[int]) -> torch.Tensor | None:
        """The block's raw KV bytes, or None (missing, foreign or corrupt: then deleted)."""
        path = self.dir / (name + _SUFFIX)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            self._forget(name, dropped=False)
            return None
        data = self._validate(raw, parent, tokens)
        if data is None:
            logger.warning("disk KV tier: %s is corrupt or foreign; deleted", path.name)
            self._forget(name, dropped=True)
            path.unlink(missing_ok=True)
            return None
        with self._lock:
            if name in self._index:
                self._index.move_to_end(name)
            self.bytes_restored += data.numel()
        return data

    def _validate(self, raw: bytes, parent: str, tokens: Sequence[int]) -> torch.Tensor | None:
        if len(raw) < 32 or hashlib.sha256(raw[32:]).digest() != raw[:32]:
            return None
        try:
            tensors = st_load(raw[32:])
            meta = json.loads(tensors["meta"].numpy().tobytes())
        except Exception:  # noqa: BLE001 - a file we cannot parse is corrupt, whatever broke
            return None
        if meta.get("fingerprint") != self.fingerprint or meta.get("parent") != parent:
            return None
        stored = tensors.get("tokens")
        if stored is None or stored.tolist() != list(tokens):
            return None
        return tensors.get("kv")

    def _forget(self, name: str, dropped: bool) -> None:
        with self._lock:
            size = self._index.pop(name, None)
            if size is not None:
                self._total -= size
                if dropped:
                    self.bytes_dropped += size

    # --- writing (queued by the step loop, done by the writer thread) ----------------------

    def submit(
        self,
        name: str,
        parent: str,
        tokens: list[int],
        data: torch.Tensor,
        ready: torch.cuda.Event | None = None,
    ) -> None:
        """Queue a block for writing: `data` is a CPU tensor the caller no longer touches,
        complete once `ready` (a device-to-host copy in flight) has passed."""
        with self._lock:
            if name in self._index or name in self._queued:
                return
            self._queued.add(name)
        self._queue.put((name, parent, tokens, data, ready))

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(*item)
            except Exception:  # noqa: BLE001 - a full or broken disk loses blocks, not the worker
                logger.exception("disk KV tier: writing a block failed")
            finally:
                if item is not None:
                    with self._lock:
                        self._queued.discard(item[0])
                self._queue.task_done()

    def _write(
        self,
        name: str,
        parent: str,
        tokens: list[int],
        data: torch.Tensor,
        ready: torch.cuda.Event | None,
    ) -> None:
        if ready is not None:
            ready.synchronize()
        meta = json.dumps({"fingerprint": self.fingerprint, "parent": parent}).encode()
        payload = st_save(
            {
                "kv": data.contiguous(),
                "tokens": torch.tensor(tokens, dtype=torch.int32),
                "meta": torch.frombuffer(bytearray(meta), dtype=torch.uint8),
            }
        )
        blob = hashlib.sha256(payload).digest() + payload
        final = self.dir / (name + _SUFFIX)
        tmp = self.dir / (name + ".tmp")
        tmp.write_bytes(blob)
        os.replace(tmp, final)
        with self._lock:
            self._index[name] = len(blob)
            self._total += len(blob)
            self.bytes_written += len(blob)
            victims = []
            while self._total > self.max_bytes and len(self._index) > 1:
                old, size = self._index.popitem(last=False)
                self._total -= size
                self.bytes_dropped += size
                victims.append(old)
        for old in victims:
            (self.dir / (old + _SUFFIX)).unlink(missing_ok=True)

    def used_bytes(self) -> int:
        with self._lock:
            return self._total

    def flush(self) -> None:
        """Wait until every queued block is on disk (tests, shutdown)."""
        self._queue.join()

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued (for at most `timeout` seconds: a shutdown must not hang on a
        slow disk; what is left is lost, and the next start deletes its temporary files)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        self._queue.put(None)
        self._writer.join(timeout=max(deadline - time.monotonic(), 0.1))
