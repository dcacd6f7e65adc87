"""A grammar compile in a process of its own, so that one that runs too long, or that nobody
waits for any more, is killed for real: its thread could not be stopped, and its memory (a big
enum's compile peaks at gigabytes) goes with the process.

A backend that can compile elsewhere gives the grammar cache a picklable `CompileRecipe`; a
worker process builds its compiler from it once and then compiles one constraint at a time,
sending back the backend's serialized form, which the backend loads on the scheduler's side
(`GrammarBackend.load_compiled`). Workers are forked by multiprocessing's fork server, which
imports the backend's module once (`PRELOAD`), so a fresh worker starts in milliseconds; a
worker that ran a big compile is retired, so that its freed heap goes back to the system.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import threading
from dataclasses import dataclass
from typing import Any

from radixserve.constrained.base_grammar_backend import CompileRecipe, GrammarError

# the fork server imports these before it forks any worker
PRELOAD = ["radixserve.constrained.xgrammar_backend"]
# a worker whose last result was bigger is replaced (glibc keeps a big heap after freeing it)
RETIRE_AFTER_BYTES = 32 << 20
_PR_SET_PDEATHSIG = 1


def _die_with_scheduler() -> None:
    """End with the scheduler, even mid-compile (which can last minutes) and even when it was
    killed: the worker's parent is the fork server, which outlives the scheduler as long as a
    worker lives, so the worker watches the process that started it."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    starter = multiprocessing.parent_process()
    if starter is None:
        return

    def watch() -> None:
        starter.join()  # returns when it has exited; the compile runs without the GIL
        os._exit(0)

    threading.Thread(target=watch, name="watch-scheduler", daemon=True).start()


def serve(conn: Any, recipe: CompileRecipe) -> None:
    """The worker's loop: one (kind, text) in, its outcome out, until the pipe closes. A
    compile that succeeds is announced ("compiled") before it is serialized: the time limit is
    the compile's, not the serialization's."""
    _die_with_scheduler()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle
    compile_one = recipe.build()
    conn.send(("ready",))
    while True:
        try:
            kind, text = conn.recv()
        except (EOFError, OSError):
            return
        try:
            serialize, nbytes = compile_one(kind, text)
            conn.send(("compiled",))
            outcome: tuple = ("ok", serialize(), nbytes)
        except GrammarError as exc:
            outcome = ("grammar_error", str(exc))
        except Exception as exc:  # the backend failed: the cache reports it as such
            outcome = ("error", f"{type(exc).__name__}: {exc}")
        conn.send(outcome)


_context_lock = threading.Lock()


def _context() -> Any:
    with _context_lock:
        context = multiprocessing.get_context("forkserver")
        # takes effect if the fork server has not started yet (else workers import it themselves)
        context.set_forkserver_preload(PRELOAD)
        return context


def processes_allowed() -> bool:
    """A daemonic process (a tensor-parallel peer rank) may not start processes of its own."""
    return not multiprocessing.current_process().daemon


class WorkerStartError(RuntimeError):
    """No worker process could be started (the cache then compiles on threads)."""


@dataclass
class CompileWorker:
    """One worker process and the pipe to it."""

    process: Any
    conn: Any

    @classmethod
    def start(cls, recipe: CompileRecipe, timeout: float = 120.0) -> CompileWorker:
        context = _context()
        parent, child = context.Pipe()
        process = context.Process(
            target=serve, args=(child, recipe), name="radixserve-grammar", daemon=True
        )
        try:
            process.start()
        except Exception as exc:
            raise WorkerStartError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            child.close()
        worker = cls(process, parent)
        if not parent.poll(timeout):
            worker.kill()
            raise WorkerStartError(f"a grammar compile worker did not start within {timeout:.0f} s")
        try:
            parent.recv()  # ("ready",)
        except EOFError:
            worker.kill()
            raise WorkerStartError(
                f"a grammar compile worker exited at start (code {process.exitcode})"
            ) from None
        return worker

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, kind: str, text: str) -> None:
        self.conn.send((kind, text))

    def poll(self, timeout: float) -> bool:
        return self.conn.poll(timeout)

    def receive(self) -> tuple:
        try:
            return self.conn.recv()
        except EOFError:
            self.process.join(1.0)
            code = self.process.exitcode
            raise RuntimeError(f"the grammar compile worker died (exit code {code})") from None

    def alive(self) -> bool:
        return self.process.is_alive()

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()
        with contextlib.suppress(Exception):
            self.process.join(5.0)
        with contextlib.suppress(Exception):
            self.conn.close()
