"""Requests that coincide with workers' deaths: remembered by fingerprint, refused at the second.

A request whose attempt ended with its worker's death (the worker answered that its scheduler
is gone, or the connection broke after the request was sent) may have killed that worker. The
router does not try it elsewhere (that would take the next worker down too) and remembers its
fingerprint (a hash of method, path with query, and body) for `ttl` seconds. When the same
fingerprint coincides with a second death, it is quarantined: identical requests are refused
with 400 without reaching any worker until the entry expires. At most `max_entries` fingerprints
are remembered, the least recently struck forgotten first.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MAX_ENTRIES = 4096
STRIKES_TO_QUARANTINE = 2


def fingerprint(method: str, path_qs: str, body: bytes) -> str:
    digest = hashlib.sha256()
    for part in (method.upper().encode(), path_qs.encode("utf-8", "surrogateescape"), body):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


@dataclass
class _Entry:
    strikes: int
    expires: float


class Quarantine:
    def __init__(
        self,
        ttl: float,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def _live(self, key: str) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None and entry.expires <= self._clock():
            del self._entries[key]
            return None
        return entry

    def is_quarantined(self, key: str) -> bool:
        entry = self._live(key)
        return entry is not None and entry.strikes >= STRIKES_TO_QUARANTINE

    def strike(self, key: str) -> bool:
        """Record a death that coincided with `key`; True when this one quarantines it."""
        if self.ttl <= 0:
            return False
        entry = self._live(key)
        if entry is None:
            entry = self._entries[key] = _Entry(0, 0.0)
        entry.strikes += 1
        entry.expires = self._clock() + self.ttl
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return entry.strikes == STRIKES_TO_QUARANTINE
