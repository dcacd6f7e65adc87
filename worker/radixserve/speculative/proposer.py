"""The proposer interface: what the verify step needs from any speculative method.

A proposer sees each speculating request's token history (prompt and output, `TokenHistory`)
and a budget (at most how many tokens it may propose for it), and returns, per request, the
tokens it proposes. The verify step never sees the proposer: it scores whatever tokens come
back and accepts them by the target's own sampling, so a new method (EAGLE-3, MTP heads) is one
more `Proposer` and touches neither verify.py nor the scheduler. A proposer with state of its
own per request (a draft model's KV) learns how many of its tokens were kept through
`on_verified`, and forgets a request in `release`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class TokenHistory:
    """A request's prompt + output ids as a growing int64 numpy buffer: proposers match and
    slice it without rebuilding an array from Python lists at every step."""

    def __init__(self, ids: Sequence[int]) -> None:
        self._buf = np.empty(max(16, 2 * len(ids)), dtype=np.int64)
        self._len = 0
        self.extend(ids)

    def __len__(self) -> int:
        return self._len

    def extend(self, ids: Sequence[int]) -> None:
        need = self._len + len(ids)
        if need > len(self._buf):
            grown = np.empty(2 * need, dtype=np.int64)
            grown[: self._len] = self._buf[: self._len]
            self._buf = grown
        self._buf[self._len : need] = ids
        self._len = need

    def view(self) -> np.ndarray:
        """The ids so far (a view: valid until the next `extend`)."""
        return self._buf[: self._len]


class Proposer(Protocol):
    """A speculative method: proposes tokens for requests that are about to decode."""

    def propose(
        self, rids: Sequence[str], histories: Sequence[TokenHistory], budgets: Sequence[int]
    ) -> list[list[int]]:
        """Per request, at most `budgets[i]` tokens that may follow `histories[i]` (fewer or
        none when it has no good guess: a row without proposals decodes one token as usual)."""
        ...

    def on_verified(self, rid: str, proposed: int, accepted: int) -> None:
        """The verify step kept `accepted` of the `proposed` tokens of request `rid`."""
        ...

    def release(self, rid: str) -> None:
        """Request `rid` is gone (called from a finalizer: defer the work to `propose`)."""
        ...
