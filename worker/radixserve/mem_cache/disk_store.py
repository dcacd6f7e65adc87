"""The disk KV tier: fixed-size token blocks in files named by a hash of the token prefix.

A block is `block_tokens` tokens (`BLOCK_TOKENS` by default); its name chains SHA-256 over the
previous block's name, an extra key (a LoRA adapter's identity, the digest of its weights;
empty for the base model) and the block's raw tokens, starting from the fingerprint of what the
bytes mean (model, dtype, KV layout, block size). So a block's name stands for its whole prefix
under its adapter, a restarted worker with the same model and settings finds the blocks an
earlier one wrote, and a worker with other settings looks in another directory.

Each file is a SHA-256 of the rest, then a safetensors payload: the block's raw KV bytes (the
host tier's token layout), its tokens and its parent's name, with the fingerprint in the
metadata. A file whose checksum, fingerprint, tokens or parent does not match is deleted and
counted dropped, never served. Files are written by one writer thread, through a temporary
file of its own and an atomic rename, so workers may share a directory (the operator's
model-cache claim: a rolled-out pod finds its predecessors' blocks); the step loop only
queues. The least recently used files go first
when the directory outgrows `--kv-disk-size`.

KV events (`event_sink`, None when off): a block is reported `stored` with medium "DISK" once
its file is in place (on the writer thread) and `removed` when the file goes (evicted past the
size, found corrupt or missing). The sink speaks in token paths from the root, so the store
keeps, for the blocks it reported, each block's parent and tokens (and those of a withdrawn
parent while a reported child still needs it for its path). An adapter's blocks are reported
under its cache keys (the uid that wrote them), as the GPU and host tiers report theirs. Blocks
an earlier worker left are reported when a sink is attached, and again after a flush of the
cache (the consumer's `AllBlocksCleared` dropped them): `announce` queues that for the writer
thread, which reads the parent and tokens from each file. Not reported that way: a block whose
parent chain is not known (a parent gone from the disk before it was reported: its hash needs
its whole prefix), and an adapter's block (the file knows the weights' digest, not the name
events carry); both are still served.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import tempfile
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from radixserve.mem_cache.base_prefix_cache import adapter_key
from radixserve.mem_cache.kv_event_sink import KVEventSink

logger = logging.getLogger(__name__)

# tokens per file: long enough that a file is worth a system call, short enough that a prefix
# shared only in part still finds most of its blocks
BLOCK_TOKENS = 64
_SUFFIX = ".kv"
# a temporary file older than this is a crashed writer's (a block is written in well under it)
STALE_TMP_SECONDS = 600
# writer-queue items: report every block on disk to the event sink; send the stored run
_ANNOUNCE = ("announce",)
_SEND = ("send",)


class DiskKey(NamedTuple):
    """A cache key as the disk tier names it: the raw token ids, the adapter's identity
    (b"" for the base model) and the uid its cache keys carry (0 for the base model)."""

    tokens: Sequence[int]
    adapter: bytes
    lora_uid: int


class DiskBlock(NamedTuple):
    """A block to write: its name, its parent's, its raw tokens, and its adapter (identity
    and uid, as in DiskKey)."""

    name: str
    parent: str
    tokens: list[int]
    adapter: bytes = b""
    lora_uid: int = 0


class _Reported:
    """A block reported stored to the event sink: its parent's name, its tokens, how many
    reported blocks name it their parent, and whether its file is still there."""

    __slots__ = ("children", "on_disk", "parent", "tokens")

    def __init__(self, parent: str, tokens: tuple[int, ...]) -> None:
        self.parent = parent
        self.tokens = tokens
        self.children = 0
        self.on_disk = True


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
        self.event_sink: KVEventSink | None = None  # set_event_sink; touched under _lock
        self._reported: dict[str, _Reported] = {}
        # stored blocks not sent yet: a chain (each the previous one's child) after `_run_base`,
        # the tokens before it, sent as one range after the last block of a `submit` series
        # (more=False), or when the chain breaks (a long prompt's blocks: one path, not one
        # per block, which the sink would hash from the root each time)
        self._run: list[tuple[int, ...]] = []
        self._run_last = ""
        self._run_base: tuple[int, ...] = ()
        self._announce_queued = False
        self._scan()
        self._queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="kv-disk-writer", daemon=True)
        self._writer.start()

    def _scan(self) -> None:
        """Index the files an earlier worker left, oldest first; leftovers of a crash go (a
        temporary file untouched for STALE_TMP_SECONDS: a live peer's is younger)."""
        entries = []
        now = time.time()
        for entry in os.scandir(self.dir):
            if entry.name.endswith(".tmp"):
                if now - entry.stat().st_mtime > STALE_TMP_SECONDS:
                    Path(entry.path).unlink(missing_ok=True)
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

    # --- KV events (every call under _lock: the sink only queues) -------------------------

    def set_event_sink(self, sink: KVEventSink | None) -> None:
        """Report to `sink` from now on, starting with the blocks already on disk."""
        with self._lock:
            self.event_sink = sink
            self._reported.clear()
            self._run.clear()
        if sink is not None:
            self.announce()

    def announce(self) -> None:
        """Report every block on disk again (after the sink was told the cache was cleared);
        done by the writer thread, after what is queued before it."""
        with self._lock:
            if self.event_sink is None or self._announce_queued:
                return  # one queued announce reports what is on disk when it runs
            self._announce_queued = True
        self._queue.put(_ANNOUNCE)

    def _path(self, name: str) -> tuple[int, ...] | None:
        """The tokens from the root to the end of a reported block, None if a link is unknown."""
        parts = []
        while name != self.fingerprint:
            block = self._reported.get(name)
            if block is None:
                return None
            parts.append(block.tokens)
            name = block.parent
        return tuple(t for part in reversed(parts) for t in part)

    def _report_stored(self, name: str, parent: str, tokens: Sequence[int]) -> None:
        if self.event_sink is None:
            return
        block = self._reported.get(name)
        if block is not None and block.on_disk:
            return
        path = self._path(parent)
        if path is None:
            return
        if block is not None:  # written again while kept as a reported child's link
            block.on_disk = True
        else:
            self._reported[name] = _Reported(parent, tuple(tokens))
            if parent in self._reported:
                self._reported[parent].children += 1
        if not self._run or parent != self._run_last:
            self._send_run()
            self._run_base = path
        self._run.append(tuple(tokens))
        self._run_last = name

    def _send_run(self) -> None:
        if self._run and self.event_sink is not None:
            tokens = self._run_base + tuple(t for block in self._run for t in block)
            self.event_sink.stored(tokens, len(self._run_base), "DISK")
        self._run.clear()
        self._run_base = ()

    def _report_removed(self, name: str) -> None:
        block = self._reported.get(name)
        if self.event_sink is None or block is None or not block.on_disk:
            return
        self._send_run()  # stored before removed, even when the same block
        path = self._path(name)  # never None: a reported block's ancestors stay while it does
        if path is not None:
            self.event_sink.removed(path, len(path) - len(block.tokens), "DISK")
        block.on_disk = False
        while block is not None and not block.on_disk and block.children == 0:
            del self._reported[name]
            name = block.parent
            block = self._reported.get(name)
            if block is not None:
                block.children -= 1

    def _announce(self) -> None:
        """Report every block on disk, parents before children (the writer thread)."""
        with self._lock:
            self._announce_queued = False
            sink = self.event_sink
            names = list(self._index)
            self._reported.clear()
            self._run.clear()
        if sink is None:
            return
        pending: dict[str, tuple[str, list[int]]] = {}
        for name in names:
            meta = self._read_meta(name)
            if meta is not None and not meta[2]:  # an adapter's block: its name is unknown
                pending[name] = meta[:2]
        # parents before children, depth first (a chain goes out as one range); the lock is
        # taken per block, as the step loop may be reading the store meanwhile
        children: dict[str, list[str]] = {}
        for name, (parent, _) in pending.items():
            children.setdefault(parent, []).append(name)
        stack = list(reversed(children.get(self.fingerprint, [])))
        while stack:  # a block whose parent is not on disk is left out: its prefix is unknown
            name = stack.pop()
            parent, tokens = pending[name]
            with self._lock:
                if self.event_sink is not sink:
                    return
                if name in self._index:
                    self._report_stored(name, parent, tokens)
            stack += reversed(children.get(name, []))

    def _read_meta(self, name: str) -> tuple[str, list[int], str] | None:
        """A file's parent name, tokens and adapter identity (hex, "" for the base model),
        from its safetensors header (the checksum is checked when the block is read, not
        here); None if unreadable."""
        try:
            with open(self.dir / (name + _SUFFIX), "rb") as f:
                f.seek(32)
                size = int.from_bytes(f.read(8), "little")
                if size > 1 << 20:  # a header is a few hundred bytes
                    return None
                header = json.loads(f.read(size))
                base = 40 + size
                fields = {}
                for key in ("tokens", "meta"):
                    begin, end = header[key]["data_offsets"]
                    f.seek(base + begin)
                    fields[key] = f.read(end - begin)
            meta = json.loads(fields["meta"])
            if meta.get("fingerprint") != self.fingerprint:
                return None
            return meta["parent"], array("i", fields["tokens"]).tolist(), meta.get("adapter", "")
        except (OSError, ValueError, KeyError, TypeError):
            return None

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
            self._report_removed(name)
            if size is not None:
                self._total -= size
                if dropped:
                    self.bytes_dropped += size

    # --- writing (queued by the step loop, done by the writer thread) ----------------------

    def submit(
        self,
        block: DiskBlock,
        data: torch.Tensor,
        ready: torch.cuda.Event | None = None,
        more: bool = False,
    ) -> None:
        """Queue a block for writing: `data` is a CPU tensor the caller no longer touches,
        complete once `ready` (a device-to-host copy in flight) has passed. `more`: the
        caller's next block continues this one's chain (its KV event waits to go with it)."""
        with self._lock:
            if block.name in self._index or block.name in self._queued:
                if not more:
                    self._queue.put(_SEND)
                return
            self._queued.add(block.name)
        self._queue.put((block, data, ready, more))

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if item is _ANNOUNCE:
                    self._announce()
                elif item is not _SEND:
                    self._write(*item[:3])
            except Exception:  # noqa: BLE001 - a full or broken disk loses blocks, not the worker
                logger.exception("disk KV tier: writing a block failed")
            finally:
                more = False
                if item is not None and item is not _ANNOUNCE and item is not _SEND:
                    more = item[3]
                    with self._lock:
                        self._queued.discard(item[0].name)
                if not more:  # a chain of blocks goes as one range (the last, or a lone one)
                    with self._lock:
                        self._send_run()
                self._queue.task_done()

    def _write(self, block: DiskBlock, data: torch.Tensor, ready: torch.cuda.Event | None) -> None:
        if ready is not None:
            ready.synchronize()
        name, parent = block.name, block.parent
        fields = {"fingerprint": self.fingerprint, "parent": parent}
        if block.adapter:
            fields["adapter"] = block.adapter.hex()
        meta = json.dumps(fields).encode()
        payload = st_save(
            {
                "kv": data.contiguous(),
                "tokens": torch.tensor(block.tokens, dtype=torch.int32),
                "meta": torch.frombuffer(bytearray(meta), dtype=torch.uint8),
            }
        )
        blob = hashlib.sha256(payload).digest() + payload
        final = self.dir / (name + _SUFFIX)
        # a name of its own: workers sharing the directory may write the same block at once
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=name, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, final)
        with self._lock:
            self._index[name] = len(blob)
            self._total += len(blob)
            self.bytes_written += len(blob)
            self._report_stored(name, parent, adapter_key(block.tokens, block.lora_uid))
            victims = []
            while self._total > self.max_bytes and len(self._index) > 1:
                old, size = self._index.popitem(last=False)
                self._total -= size
                self.bytes_dropped += size
                self._report_removed(old)
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
