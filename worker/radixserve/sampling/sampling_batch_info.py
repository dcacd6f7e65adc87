"""Per-request SamplingParams batched into device tensors: the running batch's sampling state.

It is mutable, and shared rather than copied: the `ModelWorkerBatch` of every pass points at
the running batch's one instance. Two parties change it, both on the scheduler's thread and in
launch order, never concurrently: the scheduler changes its membership between launches
(`filter_batch` when requests leave, `merge_batch` when they join), and the model worker
advances its per-token state when it launches a pass's sampling (`update_with_new_tokens`,
queued on the device behind that sampling). Everything the Sampler does per step is a
whole-batch tensor op over these fields.

Rows that follow a grammar (constrained decoding) keep their request's matcher in `grammars`;
`start_grammar_mask` begins turning the matchers' current states into one token bitmask for the
batch (on the grammar backend's mask thread, as soon as every matcher has accepted its row's
last token), and `update_grammar_mask`, right before sampling, puts it on the device, where the
sampler applies it with the other logit processors. A batch with such rows has its sampling
launched after the batch before it is resolved (`ModelWorker.sample_deferred`), still before the
scheduler next changes the membership.

Random sampling is reproducible per request: the noise of row i at a step is a counter-based
hash of (the row's seed, tokens it has generated so far, vocab index), computed with integer
tensor ops. So a seeded request draws the same tokens whatever else is in the batch and
wherever its row is, and resuming it (retraction, chunked prefill) continues the same stream.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixserve.constrained.base_grammar_backend import Grammar, PendingVocabMask, VocabMask
from radixserve.sampling.penalties import BatchedPenalizers, ReqLike
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.utils import device_tensor

_MASK32 = 0xFFFFFFFF


def _as_int32(value: int) -> int:
    """The int32 with the same bit pattern as the 32-bit unsigned `value`."""
    value &= _MASK32
    return value - (1 << 32) if value >= 1 << 31 else value


_GOLDEN32 = _as_int32(0x9E3779B9)
_FMIX_C1 = _as_int32(0x85EBCA6B)
_FMIX_C2 = _as_int32(0xC2B2AE35)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int32 bit patterns (torch's `>>` on int32 is arithmetic and
    torch has no uint32 shift)."""
    return (x >> bits) & ((1 << (32 - bits)) - 1)


def fmix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finalizer (a bijection with full avalanche) on int32 tensors
    holding uint32 bit patterns. int32 products wrap modulo 2**32 on every torch backend,
    which is exactly uint32 multiplication; int32 keeps the [bs, vocab] work cheap."""
    x = x ^ _shift_right(x, 16)
    x = x * _FMIX_C1
    x = x ^ _shift_right(x, 13)
    x = x * _FMIX_C2
    return x ^ _shift_right(x, 16)


def _seed_keys(seeds: Sequence[int], device: torch.device) -> torch.Tensor:
    """Fold 64-bit seeds into well-mixed 32-bit row keys."""
    halves = device_tensor(
        [[_as_int32(s) for s in seeds], [_as_int32(s >> 32) for s in seeds]], torch.int32, device
    )
    low, high = halves[0], halves[1]
    return fmix32(low ^ fmix32(high ^ _GOLDEN32))


@dataclass
class SamplingBatchInfo:
    """Per-request SamplingParams batched into device tensors, built once when a batch forms and
    kept in step with it (filter when requests leave, merge when they join)."""

    vocab_size: int
    device: torch.device
    sampling_params: list[SamplingParams]
    temperatures: torch.Tensor  # [bs, 1] float32; 1.0 on greedy rows (never divided by 0)
    top_ps: torch.Tensor  # [bs, 1] float32
    top_ks: torch.Tensor  # [bs, 1] int64; vocab_size where top-k is off
    min_ps: torch.Tensor  # [bs, 1] float32
    greedy: torch.Tensor  # [bs] bool
    seed_keys: torch.Tensor  # [bs] int32 holding 32-bit keys
    num_generated: torch.Tensor  # [bs] int64, tokens each request has generated so far
    penalizers: BatchedPenalizers
    grammars: list[Grammar | None]  # per row: the request's matcher, if it is constrained
    # this step's mask of the constrained rows: being filled, then on the device
    pending_mask: PendingVocabMask | None = None
    vocab_mask: VocabMask | None = None
    is_all_greedy: bool = True
    max_top_k: int = 0  # largest top_k among sampled rows with top-k on; 0: top-k unused
    need_top_p: bool = False
    need_min_p: bool = False
    has_grammars: bool = False

    @classmethod
    def from_reqs(
        cls,
        reqs: Sequence[ReqLike],
        vocab_size: int,
        device: torch.device | str,
        eos_token_ids: set[int],
    ) -> SamplingBatchInfo:
        device = torch.device(device)
        params = [r.sampling_params for r in reqs]

        def column(values: list, dtype: torch.dtype) -> torch.Tensor:
            return device_tensor(values, dtype, device).view(-1, 1)

        # An unseeded request gets a fresh random seed, so unseeded requests differ.
        seeds = [p.seed if p.seed is not None else secrets.randbits(64) for p in params]
        info = cls(
            vocab_size=vocab_size,
            device=device,
            sampling_params=params,
            temperatures=column(
                [1.0 if p.is_greedy else p.temperature for p in params], torch.float32
            ),
            top_ps=column([p.top_p for p in params], torch.float32),
            top_ks=column([p.top_k if p.top_k > 0 else vocab_size for p in params], torch.int64),
            min_ps=column([p.min_p for p in params], torch.float32),
            greedy=device_tensor([p.is_greedy for p in params], torch.bool, device),
            seed_keys=_seed_keys(seeds, device),
            num_generated=device_tensor([len(r.output_ids) for r in reqs], torch.int64, device),
            penalizers=BatchedPenalizers.from_reqs(reqs, vocab_size, device, eos_token_ids),
            grammars=[r.grammar for r in reqs],
        )
        info._refresh_flags()
        return info

    @property
    def batch_size(self) -> int:
        return len(self.sampling_params)

    @property
    def is_plain_greedy(self) -> bool:
        """Every row takes the argmax of the raw logits: all greedy, no logit processors."""
        return self.is_all_greedy and self.penalizers.is_empty and not self.has_grammars

    @property
    def need_top_k(self) -> bool:
        return self.max_top_k > 0

    def _refresh_flags(self) -> None:
        """Host-side flags that let the Sampler skip whole ops (no device sync to decide)."""
        sampled = [p for p in self.sampling_params if not p.is_greedy]
        self.is_all_greedy = not sampled
        self.max_top_k = max((p.top_k for p in sampled if 0 < p.top_k < self.vocab_size), default=0)
        self.need_top_p = any(p.top_p < 1.0 for p in sampled)
        self.need_min_p = any(p.min_p > 0.0 for p in sampled)
        self.has_grammars = any(g is not None for g in self.grammars)
        # rows moved: a mask is rebuilt before the next sampling
        self.pending_mask = self.vocab_mask = None

    def start_grammar_mask(self) -> None:
        """Begin this step's token mask from the constrained rows' matchers, as they stand: call
        once every row's grammar has accepted the row's previous token, and touch no matcher
        until `update_grammar_mask`. A terminated grammar allows nothing more, and its request is
        finished: the row samples unmasked and its token is dropped."""
        rows = [i for i, g in enumerate(self.grammars) if g is not None and not g.is_terminated()]
        if not rows:
            self.pending_mask = None
            return
        grammars = [self.grammars[i] for i in rows]
        backend = grammars[0].backend
        self.pending_mask = backend.start_token_bitmask(
            grammars, rows, self.batch_size, pinned=self.device.type == "cuda"
        )

    def update_grammar_mask(self) -> None:
        """Put this step's mask on the device: the fill `start_grammar_mask` began, or, if it was
        not called this step, one filled now."""
        if self.pending_mask is None:
            self.start_grammar_mask()
        pending, self.pending_mask = self.pending_mask, None
        self.vocab_mask = pending.wait(self.device) if pending is not None else None

    def apply_logits_processors(self, logits: torch.Tensor) -> None:
        """Penalties, logit_bias and the min_new_tokens mask, then the grammar mask, in place on
        `[bs, vocab]` float32 logits."""
        if not self.penalizers.is_empty:
            self.penalizers.apply(logits, self.num_generated)
        if self.vocab_mask is not None:
            self.vocab_mask.apply(logits)

    def update_with_new_tokens(
        self, next_token_ids: torch.Tensor, counts: torch.Tensor | None = None
    ) -> None:
        """Count the tokens just sampled (`[bs]` on the device) for penalties and the step
        counters. A verify step passes its `[bs, K + 1]` tokens and `counts` (`[bs]`), how many
        of them each row emits."""
        if counts is None:
            if not self.penalizers.is_empty:
                self.penalizers.update(next_token_ids)
            self.num_generated += 1
            return
        if not self.penalizers.is_empty:
            for j in range(next_token_ids.shape[1]):
                self.penalizers.update(next_token_ids[:, j], mask=counts > j)
        self.num_generated += counts

    def gumbel_noise(self, step_offset: int = 0) -> torch.Tensor:
        """`[bs, vocab]` float32 standard Gumbel noise for this step (or `step_offset` tokens
        ahead), a pure function of (seed, tokens generated so far, vocab index) per row."""
        step = (self.num_generated + step_offset).to(torch.int32) * _GOLDEN32
        step_keys = fmix32(self.seed_keys ^ fmix32(step))
        vocab = torch.arange(self.vocab_size, dtype=torch.int32, device=self.device)
        vocab_keys = fmix32(vocab + _GOLDEN32)
        bits = fmix32(vocab_keys.unsqueeze(0) ^ step_keys.unsqueeze(1))
        # 23 bits so (m + 0.5) * 2**-23 is exact in float32 and strictly inside (0, 1).
        uniform = (_shift_right(bits, 9).to(torch.float32) + 0.5) * (2.0**-23)
        return -torch.log(-torch.log(uniform))

    def filter_batch(self, keep_indices: list[int]) -> None:
        """Keep the rows `keep_indices`, in that order."""
        keep = device_tensor(keep_indices, torch.int64, self.device)
        self.sampling_params = [self.sampling_params[i] for i in keep_indices]
        self.grammars = [self.grammars[i] for i in keep_indices]
        for name in _ROW_TENSORS:
            setattr(self, name, getattr(self, name)[keep])
        self.penalizers.filter(keep, self.sampling_params)
        self._refresh_flags()

    def merge_batch(self, other: SamplingBatchInfo) -> None:
        """Append `other`'s rows after this batch's."""
        self.sampling_params = self.sampling_params + other.sampling_params
        self.grammars = self.grammars + other.grammars
        for name in _ROW_TENSORS:
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        self.penalizers.merge(other.penalizers)
        self._refresh_flags()


_ROW_TENSORS = (
    "temperatures",
    "top_ps",
    "top_ks",
    "min_ps",
    "greedy",
    "seed_keys",
    "num_generated",
)
