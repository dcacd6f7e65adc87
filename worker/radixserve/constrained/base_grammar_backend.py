"""The grammar-backend interface: what the scheduler and the sampler ask of constrained decoding.

A backend compiles a constraint (kind, text) into a `CompiledGrammar` once; each request then
walks it with its own `Grammar` (a matcher: the tokens accepted so far decide the next allowed
set). Per step, the rows of a batch that follow a grammar get their allowed sets as one token
bitmask (`token_bitmask`, filled on the host for those rows only and copied once), which the
sampler applies to the whole batch's logits on the device (`VocabMask.apply`); a row without a
grammar has all bits set, so its logits are untouched.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
        """The grammar has ended: it accepted a stop token and allows nothing more."""


@dataclass(frozen=True)
class CompiledGrammar:
    """A compiled constraint, shared by every request that asks for the same one."""

    backend: GrammarBackend
    handle: Any  # the backend's own compiled form

    def new_grammar(self) -> Grammar:
        return self.backend.new_grammar(self.handle)


@dataclass(frozen=True)
class VocabMask:
    """One step's token bitmask for a batch, on the device: `[bs, ceil(vocab / 32)]` int32, bit j
    of row i set when row i may sample token j."""

    bitmask: torch.Tensor
    backend: GrammarBackend

    def apply(self, logits: torch.Tensor) -> None:
        """Disallowed tokens' logits become -inf, in place on `[bs, vocab]` logits."""
        self.backend.apply_token_bitmask(logits, self.bitmask)


class GrammarBackend(ABC):
    """Compiles constraints for one model's vocabulary and builds and applies token masks.

    `compile` runs on the grammar cache's threads; everything else on the scheduler's."""

    @abstractmethod
    def compile(self, kind: str, text: str) -> CompiledGrammar:
        """Compile a constraint (kind in validation.CONSTRAINT_KINDS); GrammarError if it is
        invalid or unsupported."""

    @abstractmethod
    def new_grammar(self, handle: Any) -> Grammar: ...

    @abstractmethod
    def token_bitmask(
        self,
        grammars: Sequence[Grammar],
        rows: Sequence[int],
        batch_size: int,
        device: torch.device,
    ) -> VocabMask:
        """The mask of a batch of `batch_size` rows in which row `rows[i]` follows `grammars[i]`
        (none of them terminated) and every other row may sample anything."""

    @abstractmethod
    def apply_token_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None: ...
