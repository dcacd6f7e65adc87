"""The grammar-backend interface: what the scheduler and the sampler ask of constrained decoding.

A backend compiles a constraint (kind, text) into a `CompiledGrammar` once; each request then
walks it with its own `Grammar` (a matcher: the tokens accepted so far decide the next allowed
set). Per step, the rows of a batch that follow a grammar get their allowed sets as one token
bitmask, filled on the host for those rows only (`start_token_bitmask`: on the backend's mask
thread, so the scheduler's own work for the step runs beside it) and copied once, which the
sampler applies to those rows' logits on the device (`VocabMask.apply`); the other rows' logits
are untouched.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import torch


class GrammarError(ValueError):
    """A constraint the backend cannot compile; the message says why (without the kind)."""


class Grammar(ABC):
    """One request's position in its grammar."""

    def __init__(self, backend: GrammarBackend) -> None:
        self.backend = backend

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance past `token_id`; False if the grammar does not allow it (state unchanged)."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """The grammar has ended: it accepted a stop token and allows nothing more. Read beside
        a mask fill (the scheduler's stop checks run while the next mask fills), so it must
        answer from what the accepts recorded, without touching the matcher."""

    # whether `rollback` works: speculative decoding walks a matcher through proposed tokens
    # and back (a grammar without it proposes nothing)
    can_rollback = False

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""
        raise NotImplementedError


class CompileRecipe(Protocol):
    """How a worker process compiles for a backend (compile_worker.py). Picklable; `build`
    runs in the worker and returns its compile function: (kind, text) -> (serialize, memory
    bytes), raising GrammarError for a constraint the compiler rejects; `serialize()` makes the
    payload `GrammarBackend.load_compiled` takes (it can take longer than the compile)."""

    def build(self) -> Callable[[str, str], tuple[Callable[[], Any], int]]: ...


@dataclass(frozen=True)
class CompiledGrammar:
    """A compiled constraint, shared by every request that asks for the same one."""

    backend: GrammarBackend
    handle: Any  # the backend's own compiled form
    # its memory as the backend reports it; None: unknown (the cache then assumes a default)
    nbytes: int | None = None

    def new_grammar(self) -> Grammar:
        return self.backend.new_grammar(self.handle)


@dataclass(frozen=True)
class VocabMask:
    """One step's token bitmask for a batch, on the device: `[bs, ceil(vocab / 32)]` int32, bit j
    of row i set when row i may sample token j. Only the constrained rows (`rows`) are filled;
    the others hold whatever the buffer held and are never read."""

    bitmask: torch.Tensor
    rows: list[int]
    backend: GrammarBackend

    def apply(self, logits: torch.Tensor) -> None:
        """Disallowed tokens' logits of the constrained rows become -inf, in place on
        `[bs, vocab]` logits."""
        self.backend.apply_token_bitmask(logits, self.bitmask, self.rows)


class PendingVocabMask:
    """A bitmask being filled on the backend's mask thread."""

    def __init__(self, fill: Future[torch.Tensor], rows: list[int], backend: GrammarBackend):
        self._fill = fill
        self.rows = rows
        self.backend = backend

    def wait(self, device: torch.device) -> VocabMask:
        """The filled mask, its copy to `device` queued (a pinned buffer on CUDA: the copy does
        not wait for the device, and torch's pinned-memory cache keeps the block until it ran)."""
        host = self._fill.result()
        bitmask = host.to(device, non_blocking=True) if device.type == "cuda" else host
        return VocabMask(bitmask, self.rows, self.backend)


class GrammarBackend(ABC):
    """Compiles constraints for one model's vocabulary and builds and applies token masks.

    `compile` runs on the grammar cache's threads (given a `compile_recipe`, the recipe's
    function runs in a worker process instead and `load_compiled` on the cache's threads),
    `fill_token_bitmask` on the mask thread (while the scheduler's thread touches none of its
    matchers: a fill walks a matcher's parser ahead and back, so even a read beside it is a
    race; `Grammar.is_terminated` answers from recorded state), everything else on the
    scheduler's."""

    _mask_thread: ThreadPoolExecutor | None = None

    @abstractmethod
    def compile(self, kind: str, text: str) -> CompiledGrammar:
        """Compile a constraint (kind in validation.CONSTRAINT_KINDS); GrammarError if it is
        invalid or unsupported."""

    def compile_recipe(self) -> CompileRecipe | None:
        """How a worker process compiles for this backend (compile_worker.py), if it can: the
        grammar cache then compiles there, where a compile that runs too long is killed for
        real. None: compiles run on threads, where one that runs too long is only abandoned."""
        return None

    def load_compiled(self, payload: Any, nbytes: int) -> CompiledGrammar:
        """A grammar a worker process compiled from `compile_recipe()`, its payload as sent."""
        raise NotImplementedError

    @abstractmethod
    def new_grammar(self, handle: Any) -> Grammar: ...

    def accept_tokens(self, grammars: Sequence[Grammar], tokens: Sequence[int]) -> list[bool]:
        """`grammars[i].accept_token(tokens[i])` for every i, in one call: a step's accepts for
        all its constrained rows (a backend with a batch API makes it one native call)."""
        return [g.accept_token(t) for g, t in zip(grammars, tokens, strict=True)]

    @abstractmethod
    def fill_token_bitmask(
        self, grammars: Sequence[Grammar], rows: Sequence[int], batch_size: int, pinned: bool
    ) -> torch.Tensor:
        """A host bitmask for a batch of `batch_size` rows in which row `rows[i]` follows
        `grammars[i]` (none of them terminated); only those rows are written. In pinned memory
        when `pinned`. It should release the GIL while it works: it runs beside the scheduler's
        Python."""

    @abstractmethod
    def apply_token_bitmask(
        self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]
    ) -> None: ...

    def start_token_bitmask(
        self, grammars: Sequence[Grammar], rows: Sequence[int], batch_size: int, pinned: bool
    ) -> PendingVocabMask:
        """Begin `fill_token_bitmask` on the mask thread; return once it has begun. Waiting for
        that hands the thread the GIL now, which it gives back as the fill enters native code;
        otherwise it would wait for the caller's Python to yield the GIL (up to the 5 ms switch
        interval, longer than the emits it is meant to run beside)."""
        if self._mask_thread is None:
            self._mask_thread = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        begun = threading.Event()

        def fill() -> torch.Tensor:
            begun.set()
            return self.fill_token_bitmask(grammars, rows, batch_size, pinned)

        future = self._mask_thread.submit(fill)
        begun.wait()
        return PendingVocabMask(future, list(rows), self)
