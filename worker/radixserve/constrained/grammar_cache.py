"""Compiled grammars by (kind, text), compiled on threads beside the scheduler's loop.

The loop asks for a grammar (`get`) and gets a future at once; it admits the request when the
future is done and never waits for one. A constraint asked for again, while compiling or later,
shares the first compile, and a failure is remembered like a success, so a bad schema sent in a
loop costs one compile. Entries leave least recently used first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from radixserve.constrained.base_grammar_backend import CompiledGrammar, GrammarBackend

MAX_ENTRIES = 256
COMPILE_THREADS = 2


class GrammarCache:
    def __init__(
        self,
        make_backend: Callable[[], GrammarBackend],
        max_entries: int = MAX_ENTRIES,
        threads: int = COMPILE_THREADS,
    ) -> None:
        self._make_backend = make_backend
        self._backend: GrammarBackend | None = None
        self._backend_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grammar")
        self._entries: OrderedDict[tuple[str, str], Future[CompiledGrammar]] = OrderedDict()
        self.max_entries = max_entries

    def get(self, kind: str, text: str) -> Future[CompiledGrammar]:
        """The compile of (kind, text): done, running or just submitted. Its exception is a
        GrammarError when the constraint itself is at fault."""
        key = (kind, text)
        future = self._entries.get(key)
        if future is None:
            future = self._pool.submit(self._compile, kind, text)
            self._entries[key] = future
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
        return future

    def __len__(self) -> int:
        return len(self._entries)

    def _compile(self, kind: str, text: str) -> CompiledGrammar:
        with self._backend_lock:
            # the backend reads the whole vocabulary: built here, off the loop, on first use
            if self._backend is None:
                self._backend = self._make_backend()
        return self._backend.compile(kind, text)
