"""Compiled grammars by (kind, text), compiled beside the scheduler's loop, within limits.

The loop asks for a grammar (`get`) and gets a future at once; it admits the request when the
future is done and never waits for one. A constraint asked for again, while compiling or later,
shares the first compile, and a failure is remembered like a success, so a bad schema sent in a
loop costs one compile.

Limits, so that pathological constraints (a 100k-value enum compiles for a minute and peaks at
gigabytes) cannot starve the others or grow the process:

- at most `max_concurrent` distinct compiles run at once; the others wait, in arrival order;
- a compile that runs longer than `timeout` seconds (None: no limit) fails with
  `GrammarTimeoutError` (a GrammarError, so its requests get a 400 naming the constraint),
  remembered like any failure;
- a compile nobody waits for any more (`release` by its last request, an abort) is cancelled;
- a backend with a `compile_recipe` compiles in worker processes (compile_worker.py): a compile
  that timed out or was cancelled is killed, and its memory goes with its process. Other
  backends compile on threads, where such a compile is abandoned: its slot is given to the
  next compile at once, and it is counted (`abandoned`) until it ends on its own;
- entries leave least recently used first beyond `max_entries` or `max_bytes` (each compiled
  grammar's memory as its backend reports it, `UNKNOWN_BYTES` if it does not).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any

from radixserve.constrained import compile_worker
from radixserve.constrained.base_grammar_backend import CompiledGrammar, GrammarError
from radixserve.constrained.compile_worker import CompileWorker, WorkerStartError

logger = logging.getLogger(__name__)

MAX_ENTRIES = 256
MAX_BYTES = 512 << 20
MAX_CONCURRENT = 4
TIMEOUT_S = 30.0
# what a compiled grammar whose backend reports no size is taken to hold
UNKNOWN_BYTES = 1 << 20
# how often a running compile checks for a cancel
_POLL_S = 0.05

Key = tuple[str, str]


class GrammarTimeoutError(GrammarError):
    """The compile ran past the cache's time limit."""


class _Cancelled(Exception):
    pass


class _Job:
    def __init__(self, key: Key, future: Future[CompiledGrammar]) -> None:
        self.key = key
        self.future = future
        self.waiters = 0
        self.cancelled = threading.Event()
        self.started = False


class GrammarCache:
    def __init__(
        self,
        make_backend: Callable[[], Any],
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
        timeout: float | None = TIMEOUT_S,
        max_concurrent: int = MAX_CONCURRENT,
        processes: bool = True,
    ) -> None:
        self._make_backend = make_backend
        self._backend: Any = None
        self._backend_lock = threading.Lock()
        self._recipe_made: tuple[Any] | None = None
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.max_concurrent = max_concurrent
        self._processes = processes and compile_worker.processes_allowed()
        self._lock = threading.RLock()
        # done compiles (with their sizes) and running or queued ones (size 0), LRU order
        self._entries: OrderedDict[Key, Future[CompiledGrammar]] = OrderedDict()
        self._sizes: dict[Key, int] = {}
        self._bytes = 0
        self._jobs: dict[Key, _Job] = {}  # not yet done
        self._queue: deque[_Job] = deque()  # not yet started
        self._running = 0
        self._abandoned: list[threading.Thread] = []
        self._idle: list[CompileWorker] = []
        self._busy: dict[int, CompileWorker] = {}
        self.killed = 0  # compiles killed (timed out or cancelled in a worker process)
        self.timed_out = 0
        self.cancelled = 0
        self._finalizer = weakref.finalize(self, _kill_all, self._idle, self._busy)

    # -- the scheduler's side ----------------------------------------------------------------
    def get(self, kind: str, text: str) -> Future[CompiledGrammar]:
        """The compile of (kind, text): done, running or just queued; the caller counts as one
        of its waiters until it is done or `release`d. Its exception is a GrammarError when the
        constraint itself is at fault (GrammarTimeoutError: it took too long)."""
        key = (kind, text)
        with self._lock:
            future = self._entries.get(key)
            if future is not None:
                self._entries.move_to_end(key)
                job = self._jobs.get(key)
                if job is not None:
                    job.waiters += 1
                return future
            future = Future()
            job = _Job(key, future)
            job.waiters = 1
            self._entries[key] = future
            self._jobs[key] = job
            self._queue.append(job)
            self._start_queued()
            return future

    def release(self, kind: str, text: str) -> None:
        """A waiter of (kind, text) leaves before the compile is done (its request was
        aborted). The last one to leave cancels the compile: dropped from the queue, or killed
        in its worker process (abandoned, on a thread)."""
        key = (kind, text)
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                return
            job.waiters -= 1
            if job.waiters > 0:
                return
            del self._jobs[key]
            if self._entries.get(key) is job.future:
                del self._entries[key]
            self.cancelled += 1
            job.cancelled.set()
            if not job.started:
                self._queue.remove(job)
        job.future.cancel()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """The compiled grammars' memory, as their backends report it."""
        return self._bytes

    def stats(self) -> dict[str, int]:
        return {
            "grammar_cache_entries": len(self._entries),
            "grammar_cache_bytes": self._bytes,
            **self.compile_stats(),
        }

    def compile_stats(self) -> dict[str, int]:
        """Compiles running and queued now; those stopped since the start, and those
        abandoned on threads that still run."""
        with self._lock:
            self._abandoned = [t for t in self._abandoned if t.is_alive()]
            return {
                "grammar_compiles_running": self._running,
                "grammar_compiles_queued": len(self._queue),
                "grammar_compiles_abandoned": len(self._abandoned),
                "grammar_compiles_timed_out": self.timed_out,
                "grammar_compiles_cancelled": self.cancelled,
            }

    def compiling_pids(self) -> list[int]:
        """The worker processes running a compile now."""
        with self._lock:
            return list(self._busy)

    def close(self) -> None:
        """Kill the worker processes (compiles still running fail)."""
        self._finalizer()

    # -- compiling ---------------------------------------------------------------------------
    def _start_queued(self) -> None:
        with self._lock:
            while self._queue and self._running < self.max_concurrent:
                job = self._queue.popleft()
                job.started = True
                self._running += 1
                threading.Thread(
                    target=self._run, args=(job,), name="grammar-compile", daemon=True
                ).start()

    def _run(self, job: _Job) -> None:
        outcome: Any = None
        error: BaseException | None = None
        try:
            backend = self._get_backend()
            recipe = self._recipe(backend)
            if recipe is not None:
                try:
                    outcome = self._run_in_process(backend, recipe, job)
                except WorkerStartError as exc:
                    logger.warning("grammars compile on threads from now on: %s", exc)
                    self._processes = False
                    recipe = None
            if recipe is None:
                outcome = self._run_on_thread(backend, job)
        except _Cancelled:
            pass
        except BaseException as exc:
            error = exc
        finally:
            self._finish(job, outcome, error)

    def _get_backend(self) -> Any:
        with self._backend_lock:
            # the backend reads the whole vocabulary: built here, off the loop, on first use
            if self._backend is None:
                self._backend = self._make_backend()
            return self._backend

    def _recipe(self, backend: Any) -> Any:
        """The backend's compile recipe, made once (xgrammar's serializes the vocabulary)."""
        if not self._processes:
            return None
        with self._backend_lock:
            if self._recipe_made is None:
                make = getattr(backend, "compile_recipe", None)
                self._recipe_made = (make() if make is not None else None,)
            return self._recipe_made[0]

    def _wait(
        self,
        job: _Job,
        done: Callable[[float], bool],
        on_stop: Callable[[], None],
        limited: bool = True,
    ) -> None:
        """Wait for `done`, the time limit (if `limited`) or a cancel; `on_stop` (kill,
        abandon) on the latter two."""
        limit = self.timeout if limited and self.timeout is not None else math.inf
        deadline = time.monotonic() + limit
        while not done(max(0.0, min(_POLL_S, deadline - time.monotonic()))):
            if job.cancelled.is_set():
                on_stop()
                raise _Cancelled
            if time.monotonic() >= deadline:
                on_stop()
                with self._lock:
                    self.timed_out += 1
                logger.warning(
                    "a %s took longer than %g s to compile (%d characters); stopped",
                    job.key[0],
                    self.timeout,
                    len(job.key[1]),
                )
                raise GrammarTimeoutError(
                    f"the grammar took longer than {self.timeout:g} s to compile"
                )

    def _run_on_thread(self, backend: Any, job: _Job) -> CompiledGrammar:
        result: Future[CompiledGrammar] = Future()

        def compile_it() -> None:
            try:
                result.set_result(backend.compile(*job.key))
            except BaseException as exc:
                result.set_exception(exc)

        thread = threading.Thread(target=compile_it, name="grammar-compile-thread", daemon=True)
        thread.start()

        def abandon() -> None:
            with self._lock:
                self._abandoned.append(thread)

        self._wait(job, lambda t: _done(result, t), abandon)
        return result.result()

    def _run_in_process(self, backend: Any, recipe: Any, job: _Job) -> CompiledGrammar:
        worker = self._take_worker(recipe)
        if job.cancelled.is_set():
            self._give_back(worker, 0)
            raise _Cancelled
        worker.send(*job.key)

        def kill() -> None:
            with self._lock:
                self._busy.pop(worker.pid, None)
                self.killed += 1
            worker.kill()

        try:
            self._wait(job, worker.poll, kill)
            outcome = worker.receive()
            if outcome[0] == "compiled":  # within the limit; now its serialization
                self._wait(job, worker.poll, kill, limited=False)
                outcome = worker.receive()
        except (_Cancelled, GrammarTimeoutError):
            raise
        except BaseException:
            kill()
            raise
        if outcome[0] == "ok":
            _, payload, nbytes = outcome
            self._give_back(worker, nbytes)
            return backend.load_compiled(payload, nbytes)
        self._give_back(worker, 0)
        if outcome[0] == "grammar_error":
            raise GrammarError(outcome[1])
        raise RuntimeError(outcome[1])

    def _take_worker(self, recipe: Any) -> CompileWorker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    self._busy[worker.pid] = worker
                    return worker
        worker = CompileWorker.start(recipe)
        with self._lock:
            self._busy[worker.pid] = worker
        return worker

    def _give_back(self, worker: CompileWorker, nbytes: int) -> None:
        with self._lock:
            self._busy.pop(worker.pid, None)
            keep = nbytes <= compile_worker.RETIRE_AFTER_BYTES and worker.alive()
            keep = keep and len(self._idle) < self.max_concurrent
            if keep:
                self._idle.append(worker)
        if not keep:
            worker.kill()

    def _finish(self, job: _Job, outcome: Any, error: BaseException | None) -> None:
        with self._lock:
            self._running -= 1
            if self._jobs.get(job.key) is job:
                del self._jobs[job.key]
            if not job.cancelled.is_set() and self._entries.get(job.key) is job.future:
                size = UNKNOWN_BYTES
                if isinstance(outcome, CompiledGrammar) and outcome.nbytes is not None:
                    size = outcome.nbytes
                elif error is not None:
                    size = len(str(error))
                self._sizes[job.key] = size
                self._bytes += size
                self._evict(keep=job.key)
            self._start_queued()
        with contextlib.suppress(InvalidStateError):  # cancelled
            if error is not None:
                job.future.set_exception(error)
            elif outcome is not None:
                job.future.set_result(outcome)
            else:
                job.future.cancel()

    def _evict(self, keep: Key) -> None:
        """Drop done entries, least recently used first, beyond the bounds (in-flight ones
        stay: their requests wait for them; `keep`, just done, goes last)."""
        for key in list(self._entries):
            if len(self._entries) <= self.max_entries and self._bytes <= self.max_bytes:
                return
            if key in self._jobs or key == keep:
                continue
            del self._entries[key]
            self._bytes -= self._sizes.pop(key, 0)
        if self._bytes > self.max_bytes or len(self._entries) > self.max_entries:
            # the one just done is bigger than the budget by itself: its requests have it
            del self._entries[keep]
            self._bytes -= self._sizes.pop(keep, 0)


def _done(future: Future, timeout: float) -> bool:
    with contextlib.suppress(TimeoutError):
        future.exception(timeout)
        return True
    return False


def _kill_all(idle: list[CompileWorker], busy: dict[int, CompileWorker]) -> None:
    for worker in [*idle, *busy.values()]:
        worker.kill()
    idle.clear()
    busy.clear()
