"""Batched logit penalties and biases, each with state that lives as long as the batch.

A penalizer's state is `[bs, vocab]`, so it is allocated only when some request in the batch
asks for it (`BatchedPenalizers` holds just the kinds in use). Rows of requests that do not
use a kind hold neutral values (penalty 1 or 0, empty masks), which is what lets two batches
with different kinds merge. Applying and updating are whole-batch tensor ops, never a loop over
requests.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from radixserve.constrained.base_grammar_backend import Grammar
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.utils import device_tensor


class ReqLike(Protocol):
    """The fields of the scheduler's `Req` that sampling reads."""

    sampling_params: SamplingParams
    origin_input_ids: list[int]
    output_ids: list[int]
    grammar: Grammar | None  # the request's matcher, when its output follows a grammar


def _token_mask(
    token_lists: Sequence[Sequence[int]], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """`[len(token_lists), vocab]` bool, True where row i's list holds the token."""
    rows = [i for i, tokens in enumerate(token_lists) for _ in tokens]
    cols = [t for tokens in token_lists for t in tokens]
    mask = torch.zeros(len(token_lists), vocab_size, dtype=torch.bool, device=device)
    if cols:
        where = device_tensor([rows, cols], torch.int64, device)
        mask.index_put_((where[0], where[1]), _true_on(device))
    return mask


def _true_on(device: torch.device) -> torch.Tensor:
    """A device-side True to index_put with: `mask[i, j] = True` copies a host scalar to the
    device, a blocking copy that waits for the batch in flight."""
    return torch.ones((), dtype=torch.bool, device=device)


def _per_row(values: list[float], device: torch.device) -> torch.Tensor:
    """`[bs, 1]` float32 column that broadcasts against `[bs, vocab]` logits."""
    return device_tensor(values, torch.float32, device).view(-1, 1)


class Penalizer(ABC):
    """One kind of penalty over the rows of a batch."""

    @staticmethod
    @abstractmethod
    def is_required(params: SamplingParams) -> bool:
        """Whether this request needs the penalty (if no request does, no state is allocated)."""

    @classmethod
    @abstractmethod
    def from_reqs(
        cls, reqs: Sequence[ReqLike], vocab_size: int, device: torch.device, eos_ids: set[int]
    ) -> Penalizer: ...

    @classmethod
    @abstractmethod
    def neutral(cls, batch_size: int, vocab_size: int, device: torch.device) -> Penalizer:
        """Rows that leave logits unchanged: stands in for a merged batch that lacks the kind."""

    @abstractmethod
    def apply(self, logits: torch.Tensor, num_generated: torch.Tensor) -> None: ...

    @abstractmethod
    def update(self, next_token_ids: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Account for the token each row just generated; with `mask` (`[bs]` bool on the
        device), only the rows it holds (a verify step emits a different count per row)."""

    @abstractmethod
    def filter(self, keep: torch.Tensor) -> None: ...

    @abstractmethod
    def merge(self, other: Penalizer) -> None: ...


@dataclass
class RepetitionPenalizer(Penalizer):
    """HF/CTRL repetition penalty over prompt and generated tokens: a seen token's positive
    logit is divided by the penalty, a negative one multiplied (as transformers'
    RepetitionPenaltyLogitsProcessor, so results match it exactly)."""

    penalties: torch.Tensor  # [bs, 1] float32
    seen: torch.Tensor  # [bs, vocab] bool

    @staticmethod
    def is_required(params: SamplingParams) -> bool:
        return params.repetition_penalty != 1.0

    @classmethod
    def from_reqs(cls, reqs, vocab_size, device, eos_ids):
        return cls(
            penalties=_per_row([r.sampling_params.repetition_penalty for r in reqs], device),
            seen=_token_mask(
                [list(r.origin_input_ids) + list(r.output_ids) for r in reqs], vocab_size, device
            ),
        )

    @classmethod
    def neutral(cls, batch_size, vocab_size, device):
        return cls(
            penalties=torch.ones(batch_size, 1, dtype=torch.float32, device=device),
            seen=torch.zeros(batch_size, vocab_size, dtype=torch.bool, device=device),
        )

    def apply(self, logits, num_generated):
        penalized = torch.where(logits < 0, logits * self.penalties, logits / self.penalties)
        logits.copy_(torch.where(self.seen, penalized, logits))

    def update(self, next_token_ids, mask=None):
        rows = torch.arange(next_token_ids.numel(), device=next_token_ids.device)
        if mask is None:
            self.seen.index_put_((rows, next_token_ids), _true_on(self.seen.device))
        else:
            self.seen[rows, next_token_ids] = self.seen[rows, next_token_ids] | mask

    def filter(self, keep):
        self.penalties = self.penalties[keep]
        self.seen = self.seen[keep]

    def merge(self, other):
        self.penalties = torch.cat([self.penalties, other.penalties])
        self.seen = torch.cat([self.seen, other.seen])


@dataclass
class FrequencyPresencePenalizer(Penalizer):
    """OpenAI frequency and presence penalties over generated tokens:
    `logit -= frequency * count + presence * (count > 0)`."""

    frequency: torch.Tensor  # [bs, 1] float32
    presence: torch.Tensor  # [bs, 1] float32
    counts: torch.Tensor  # [bs, vocab] float32, times each token was generated

    @staticmethod
    def is_required(params: SamplingParams) -> bool:
        return params.frequency_penalty != 0.0 or params.presence_penalty != 0.0

    @classmethod
    def from_reqs(cls, reqs, vocab_size, device, eos_ids):
        counts = torch.zeros(len(reqs), vocab_size, dtype=torch.float32, device=device)
        rows = [i for i, r in enumerate(reqs) for _ in r.output_ids]
        cols = [t for r in reqs for t in r.output_ids]
        if cols:
            where = device_tensor([rows, cols], torch.int64, device)
            counts.index_put_(
                (where[0], where[1]),
                torch.ones(len(cols), dtype=torch.float32, device=device),
                accumulate=True,
            )
        return cls(
            frequency=_per_row([r.sampling_params.frequency_penalty for r in reqs], device),
            presence=_per_row([r.sampling_params.presence_penalty for r in reqs], device),
            counts=counts,
        )

    @classmethod
    def neutral(cls, batch_size, vocab_size, device):
        return cls(
            frequency=torch.zeros(batch_size, 1, dtype=torch.float32, device=device),
            presence=torch.zeros(batch_size, 1, dtype=torch.float32, device=device),
            counts=torch.zeros(batch_size, vocab_size, dtype=torch.float32, device=device),
        )

    def apply(self, logits, num_generated):
        logits -= self.counts * self.frequency + (self.counts > 0) * self.presence

    def update(self, next_token_ids, mask=None):
        rows = torch.arange(next_token_ids.numel(), device=next_token_ids.device)
        self.counts[rows, next_token_ids] += 1.0 if mask is None else mask.to(torch.float32)

    def filter(self, keep):
        self.frequency = self.frequency[keep]
        self.presence = self.presence[keep]
        self.counts = self.counts[keep]

    def merge(self, other):
        self.frequency = torch.cat([self.frequency, other.frequency])
        self.presence = torch.cat([self.presence, other.presence])
        self.counts = torch.cat([self.counts, other.counts])


@dataclass
class LogitBiasPenalizer(Penalizer):
    """OpenAI's logit_bias: per row, a few token ids whose logits get a fixed value added. Held
    sparse, `[bs, k]` for the batch's largest k; shorter rows pad with token 0 and bias 0.0, an
    exact no-op, so applying it is one scatter-add over the batch."""

    token_ids: torch.Tensor  # [bs, k] int64
    biases: torch.Tensor  # [bs, k] float32

    @staticmethod
    def is_required(params: SamplingParams) -> bool:
        return bool(params.logit_bias)

    @classmethod
    def from_reqs(cls, reqs, vocab_size, device, eos_ids):
        entries = [list((r.sampling_params.logit_bias or {}).items()) for r in reqs]
        width = max(len(e) for e in entries)
        padded = [e + [(0, 0.0)] * (width - len(e)) for e in entries]
        return cls(
            token_ids=device_tensor([[t for t, _ in e] for e in padded], torch.int64, device),
            biases=device_tensor([[b for _, b in e] for e in padded], torch.float32, device),
        )

    @classmethod
    def neutral(cls, batch_size, vocab_size, device):
        return cls(
            token_ids=torch.zeros(batch_size, 1, dtype=torch.int64, device=device),
            biases=torch.zeros(batch_size, 1, dtype=torch.float32, device=device),
        )

    def apply(self, logits, num_generated):
        logits.scatter_add_(1, self.token_ids, self.biases)

    def update(self, next_token_ids, mask=None):
        """Nothing to track: a bias does not change as tokens are generated."""

    def filter(self, keep):
        self.token_ids = self.token_ids[keep]
        self.biases = self.biases[keep]

    def merge(self, other):
        width = max(self.token_ids.shape[1], other.token_ids.shape[1])
        self.token_ids = torch.cat(
            [_pad_columns(self.token_ids, width), _pad_columns(other.token_ids, width)]
        )
        self.biases = torch.cat(
            [_pad_columns(self.biases, width), _pad_columns(other.biases, width)]
        )


def _pad_columns(x: torch.Tensor, width: int) -> torch.Tensor:
    """`x` `[bs, k]` with zero columns appended up to `width`."""
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


@dataclass
class MinNewTokensPenalizer(Penalizer):
    """Forbids stopping early: EOS (unless `ignore_eos`, where EOS does not stop) and the
    request's stop_token_ids get -inf while fewer than min_new_tokens tokens are generated."""

    min_new_tokens: torch.Tensor  # [bs] int64
    stop_tokens: torch.Tensor  # [bs, vocab] bool

    @staticmethod
    def is_required(params: SamplingParams) -> bool:
        return params.min_new_tokens > 0

    @classmethod
    def from_reqs(cls, reqs, vocab_size, device, eos_ids):
        stop_lists = [
            list(r.sampling_params.stop_token_ids)
            + ([] if r.sampling_params.ignore_eos else sorted(eos_ids))
            for r in reqs
        ]
        return cls(
            min_new_tokens=device_tensor(
                [r.sampling_params.min_new_tokens for r in reqs], torch.int64, device
            ),
            stop_tokens=_token_mask(stop_lists, vocab_size, device),
        )

    @classmethod
    def neutral(cls, batch_size, vocab_size, device):
        return cls(
            min_new_tokens=torch.zeros(batch_size, dtype=torch.int64, device=device),
            stop_tokens=torch.zeros(batch_size, vocab_size, dtype=torch.bool, device=device),
        )

    def apply(self, logits, num_generated):
        too_early = (num_generated < self.min_new_tokens).unsqueeze(1)
        logits.masked_fill_(self.stop_tokens & too_early, float("-inf"))

    def update(self, next_token_ids, mask=None):
        """Nothing to track: the step counter lives in SamplingBatchInfo.num_generated."""

    def filter(self, keep):
        self.min_new_tokens = self.min_new_tokens[keep]
        self.stop_tokens = self.stop_tokens[keep]

    def merge(self, other):
        self.min_new_tokens = torch.cat([self.min_new_tokens, other.min_new_tokens])
        self.stop_tokens = torch.cat([self.stop_tokens, other.stop_tokens])


# Applied in this order: repetition (scales logits), then the OpenAI subtractive penalties and
# logit_bias, then the min_new_tokens mask last so nothing can lift a forbidden token back from
# -inf (SamplingBatchInfo applies a grammar's mask after all of them, for the same reason).
PENALIZER_KINDS: tuple[type[Penalizer], ...] = (
    RepetitionPenalizer,
    FrequencyPresencePenalizer,
    LogitBiasPenalizer,
    MinNewTokensPenalizer,
)


@dataclass
class BatchedPenalizers:
    """The penalizers some request of the batch needs, kept in step with the batch's rows."""

    batch_size: int
    vocab_size: int
    device: torch.device
    active: dict[type[Penalizer], Penalizer]

    @classmethod
    def from_reqs(
        cls, reqs: Sequence[ReqLike], vocab_size: int, device: torch.device, eos_ids: set[int]
    ) -> BatchedPenalizers:
        active = {
            kind: kind.from_reqs(reqs, vocab_size, device, eos_ids)
            for kind in PENALIZER_KINDS
            if any(kind.is_required(r.sampling_params) for r in reqs)
        }
        return cls(len(reqs), vocab_size, torch.device(device), active)

    @property
    def is_empty(self) -> bool:
        return not self.active

    def apply(self, logits: torch.Tensor, num_generated: torch.Tensor) -> None:
        for kind in PENALIZER_KINDS:
            if kind in self.active:
                self.active[kind].apply(logits, num_generated)

    def update(self, next_token_ids: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        for penalizer in self.active.values():
            penalizer.update(next_token_ids, mask)

    def filter(self, keep: torch.Tensor, kept_params: Sequence[SamplingParams]) -> None:
        """Keep rows `keep`; drop kinds that no remaining request needs (frees their state)."""
        self.batch_size = len(kept_params)
        self.active = {
            kind: penalizer
            for kind, penalizer in self.active.items()
            if any(kind.is_required(p) for p in kept_params)
        }
        for penalizer in self.active.values():
            penalizer.filter(keep)

    def merge(self, other: BatchedPenalizers) -> None:
        """Append other's rows; a kind only one side has gets neutral rows on the other."""
        merged: dict[type[Penalizer], Penalizer] = {}
        for kind in PENALIZER_KINDS:
            if kind not in self.active and kind not in other.active:
                continue
            left = self.active.get(kind)
            if left is None:
                left = kind.neutral(self.batch_size, self.vocab_size, self.device)
            right = other.active.get(kind)
            if right is None:
                right = kind.neutral(other.batch_size, self.vocab_size, self.device)
            left.merge(right)
            merged[kind] = left
        self.active = merged
        self.batch_size += other.batch_size
