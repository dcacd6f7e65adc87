"""N-gram (prompt lookup) proposer: copy what followed the last time this suffix appeared.

Code edits, tool-call arguments and quoting answers repeat their input; when the request's last
n tokens appeared earlier in its prompt or output, the tokens that followed them there are a
good guess of what comes next. Longest suffix first (`max_n` down to `min_n`), the most recent
earlier occurrence that still has a full `k` tokens after it (else the most recent one).

On the host, vectorized: candidates are the positions holding the last token (one comparison
over the history), and only those are checked for the longer suffix, so a step over a 4k-token
history costs tens of microseconds per request.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from radixserve.speculative.proposer import TokenHistory


def lookup(tokens: np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """The up to `k` tokens that followed the most recent earlier occurrence of the longest
    suffix (between `min_n` and `max_n` tokens) of `tokens`; [] when none recurs."""
    length = len(tokens)
    if k <= 0 or length < min_n + 1:
        return []
    # q: where an earlier occurrence would end (its last token equals the history's last)
    ends = np.flatnonzero(tokens[: length - 1] == tokens[length - 1])
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        q = ends[ends >= n - 1]
        if n > 1 and q.size:
            window = q[:, None] + np.arange(1 - n, 1)
            q = q[(tokens[window] == tokens[length - n :]).all(axis=1)]
        if q.size == 0:
            continue
        full = q[q + k < length]
        start = int((full if full.size else q)[-1]) + 1
        return tokens[start : start + k].tolist()
    return []


class NgramProposer:
    """`--speculative-method ngram`: stateless beyond the histories the speculator keeps."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n

    def propose(
        self, rids: Sequence[str], histories: Sequence[TokenHistory], budgets: Sequence[int]
    ) -> list[list[int]]:
        return [
            lookup(h.view(), k, self.min_n, self.max_n)
            for h, k in zip(histories, budgets, strict=True)
        ]

    def on_verified(self, rid: str, proposed: int, accepted: int) -> None:
        """Nothing to roll back: the history is the request's own tokens."""

    def release(self, rid: str) -> None:
        """Nothing kept per request."""
