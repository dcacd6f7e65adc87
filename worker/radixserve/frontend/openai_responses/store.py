"""Where stored responses live, for `previous_response_id`, `GET` and `DELETE /v1/responses/{id}`.

A stored response is one JSON object: the Response as it was returned, and `conversation`, the
items it answered (the earlier conversation a `previous_response_id` named, then its own input;
instructions are not carried over, as OpenAI does). Continuing it prepends
`conversation + response.output` to the next input.

Two stores, bounded by `--responses-store-size` responses (0: nothing is stored), the least
recently used dropped first:

- `MemoryStore` (the default): a dict in the front-end process; gone when it exits.
- `DirectoryStore` (`--responses-store-dir DIR`): one `<id>.json` file a response, written to a
  temporary file and renamed (atomic: a crash leaves the old file or the new, never half of
  one), so that responses survive restarts. It belongs to one worker: two processes sharing a
  directory would each evict by their own count.

Neither is a replicated database: behind a router, a `previous_response_id` works only on the
worker that holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol

from radixserve.frontend.openai_responses.protocol import RESPONSE_ID

logger = logging.getLogger(__name__)

StoredResponse = dict[str, Any]


class ResponseStore(Protocol):
    async def get(self, response_id: str) -> StoredResponse | None: ...

    async def put(self, response_id: str, stored: StoredResponse) -> None: ...

    async def delete(self, response_id: str) -> bool: ...


class MemoryStore:
    """At most `capacity` responses in memory, least recently used dropped first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    async def get(self, response_id: str) -> StoredResponse | None:
        stored = self._items.get(response_id)
        if stored is not None:
            self._items.move_to_end(response_id)
        return stored

    async def put(self, response_id: str, stored: StoredResponse) -> None:
        if self.capacity <= 0:
            return
        self._items[response_id] = stored
        self._items.move_to_end(response_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    async def delete(self, response_id: str) -> bool:
        return self._items.pop(response_id, None) is not None


class DirectoryStore:
    """At most `capacity` responses as `<id>.json` files in `directory`, least recently used
    (by modification time: a read touches the file) removed first. File work runs on a
    thread, never on the event loop."""

    def __init__(self, directory: str | os.PathLike[str], capacity: int) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.capacity = capacity
        # id -> last use, oldest first: rebuilt from the files' times at start
        self._order: OrderedDict[str, None] = OrderedDict()
        found = []
        for path in self.directory.glob("resp_*.json"):
            if RESPONSE_ID.fullmatch(path.stem):
                with contextlib.suppress(OSError):
                    found.append((path.stat().st_mtime, path.stem))
        for _, response_id in sorted(found):
            self._order[response_id] = None
        for leftover in self.directory.glob(".resp_*.tmp"):  # a write a crash interrupted
            with contextlib.suppress(OSError):
                leftover.unlink()
        self._remove(self._evicted())
        self._lock = asyncio.Lock()
        logger.info("responses store: %d in %s (at most %d)", len(self._order), directory, capacity)

    def __len__(self) -> int:
        return len(self._order)

    def _path(self, response_id: str) -> Path:
        if not RESPONSE_ID.fullmatch(response_id):  # never a path of the client's choosing
            raise ValueError(f"not a response id: {response_id!r}")
        return self.directory / f"{response_id}.json"

    async def get(self, response_id: str) -> StoredResponse | None:
        if response_id not in self._order:
            return None
        stored = await asyncio.to_thread(self._read, self._path(response_id))
        if stored is None:
            self._order.pop(response_id, None)
        else:
            self._order.move_to_end(response_id)
        return stored

    async def put(self, response_id: str, stored: StoredResponse) -> None:
        if self.capacity <= 0:
            return
        path = self._path(response_id)
        async with self._lock:
            await asyncio.to_thread(self._write, path, stored)
            self._order[response_id] = None
            self._order.move_to_end(response_id)
            await asyncio.to_thread(self._remove, self._evicted())

    async def delete(self, response_id: str) -> bool:
        if response_id not in self._order:
            return False
        self._order.pop(response_id)
        path = self._path(response_id)
        try:
            await asyncio.to_thread(path.unlink)
        except FileNotFoundError:
            return False
        return True

    @staticmethod
    def _read(path: Path) -> StoredResponse | None:
        try:
            with path.open(encoding="utf-8") as file:
                stored = json.load(file)
            os.utime(path)  # recently used: evicted last
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            logger.warning("responses store: cannot read %s: %s", path, exc)
            return None
        return stored if isinstance(stored, dict) else None

    def _write(self, path: Path, stored: StoredResponse) -> None:
        fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=".resp_", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                json.dump(stored, file, separators=(",", ":"))
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise

    def _evicted(self) -> list[Path]:
        """The files beyond capacity, oldest first, dropped from the index (on the loop)."""
        paths = []
        while len(self._order) > max(self.capacity, 0):
            oldest, _ = self._order.popitem(last=False)
            paths.append(self.directory / f"{oldest}.json")
        return paths

    @staticmethod
    def _remove(paths: list[Path]) -> None:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def make_store(capacity: int, directory: str | None) -> MemoryStore | DirectoryStore:
    """The store `--responses-store-size` and `--responses-store-dir` ask for."""
    if directory:
        return DirectoryStore(directory, capacity)
    return MemoryStore(capacity)
