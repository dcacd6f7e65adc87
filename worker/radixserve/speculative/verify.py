"""The verify step's acceptance, on the device: which proposed tokens the target keeps.

Request i's rows of the verify pass's logits are positions 0..k_i: position 0 follows the
request's last token, position j follows its j-th proposed token. At every position the target
picks its own token exactly as a plain decode step of that token would (`Sampler`'s order:
penalties and the grammar mask, then the argmax for greedy rows, else temperature, top-k/top-p/
min-p and Gumbel-max with the noise of the row's `num_generated + j`-th token). The proposals
are accepted while they equal the target's picks; the row emits the accepted proposals plus the
target's token at the first mismatch (or after the last proposal): at least one token, at most
k_i + 1.

Greedy rows: the longest matching prefix plus the target's next token. Sampled rows: this is
Leviathan et al.'s / Chen et al.'s speculative sampling for a proposal that is one token (a
point mass q = δ_d, as n-gram and greedy draft proposals are): the proposal d is kept with
probability min(1, p(d) / q(d)) = p(d), the chance the target's own sample is d, and after a
rejection the token is drawn from the residual max(0, p - q) renormalized = p without d, which
is the target's sample given that it is not d. So each emitted token has exactly the target's
distribution, and a seeded request even emits the very tokens it would without speculation
(same noise per token). What depends on the tokens before a position follows the proposals:
penalties at position j are applied from a copy of the penalty state that took the row's first
j proposals (the real one takes the emitted tokens once the step is accepted), min_new_tokens
counts them, and a constrained row's mask is its grammar's after them (the matcher walks them
for the masks and is rolled back; the scheduler then accepts the tokens the row emits).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from radixserve.constrained.base_grammar_backend import Grammar
from radixserve.kernels.argmax import argmax
from radixserve.layers.sampler import sample_rows
from radixserve.sampling.sampling_batch_info import SamplingBatchInfo
from radixserve.utils import device_tensor


@dataclass
class VerifyOutput:
    tokens: torch.Tensor  # [bs, K + 1] int64: the target's token at each position
    num_accepted: torch.Tensor  # [bs] int64: proposals kept; row i emits tokens[i, : m_i + 1]
    logprobs: torch.Tensor | None  # [bs, K + 1] float32: raw logprob of tokens[i, j]
    top_logprobs: list[list[list[tuple[int, float]]]] | None  # per row, per position


def position_layout(draft_lens: list[int], inputs: list[int]) -> tuple[list[int], int]:
    """For every (request i, position j), flattened `[bs * (K + 1)]`: the row of the logits
    (positions past a request's proposals repeat its last row: their picks are never emitted);
    then for every (i, j < K), `[bs * K]`, the proposal position j is checked against (its
    input one row further on; -1 past the request's proposals, which no pick equals); and K.
    One list, so that the device gets it in one copy."""
    width = max(draft_lens, default=0)
    rows: list[int] = []
    proposals: list[int] = []
    start = 0
    for k in draft_lens:
        rows.extend(start + min(j, k) for j in range(width + 1))
        proposals.extend(inputs[start + 1 : start + 1 + k])
        proposals.extend([-1] * (width - k))
        start += k + 1
    return rows + proposals, width


def verify(
    logits: torch.Tensor,
    inputs: list[int],
    draft_lens: list[int],
    info: SamplingBatchInfo,
    return_logprob: bool = False,
    top_logprobs_nums: list[int] | None = None,
    greedy_ids: torch.Tensor | None = None,
) -> VerifyOutput:
    """Accept proposals: `logits` `[sum(k_i + 1), vocab]` float32 of the verify pass, `inputs`
    its input ids on the host (request i's last token, then its `draft_lens[i]` proposals).
    `greedy_ids`: the argmax of every row, when the batch is plain greedy and the pass took it
    already (a replayed CUDA graph does): the picks are then those (taken here otherwise).
    At batch 1 the step is bound by the host: a handful of device ops, one copy in."""
    bs = len(draft_lens)
    layout, width = position_layout(draft_lens, inputs)
    layout = device_tensor(layout, torch.int64, logits.device)
    rows = layout[: bs * (width + 1)].view(bs, width + 1)
    proposals = layout[bs * (width + 1) :].view(bs, width)

    if greedy_ids is None and info.is_plain_greedy:
        # every position's pick is its row's raw argmax: one reduction over all rows, not one
        # gather and reduction per position (the eager pass; a replayed graph took it already)
        greedy_ids = argmax(logits)
    if greedy_ids is not None:
        tokens = greedy_ids[rows]
    else:
        walk = GrammarWalk(info, draft_lens, inputs) if info.has_grammars else None
        try:
            tokens = _picks(logits, rows, info, walk, proposals)
        finally:
            if walk is not None:
                walk.rollback()
    num_accepted = (tokens[:, :width] == proposals).to(torch.int64).cumprod(dim=1).sum(dim=1)

    logprobs = top = None
    if return_logprob:
        raw = torch.log_softmax(logits, dim=-1)[rows.view(-1)]  # [bs * (K + 1), vocab]
        logprobs = raw.gather(1, tokens.view(-1, 1)).view(bs, width + 1)
        top = _top_logprobs(raw, top_logprobs_nums or [0] * bs, width + 1)
    return VerifyOutput(tokens, num_accepted, logprobs, top)


class GrammarWalk:
    """The constrained rows' masks past position 0: each matcher accepts its row's proposals
    one position at a time, and `rollback` returns it to where it stood."""

    def __init__(self, info: SamplingBatchInfo, draft_lens: list[int], inputs: list[int]):
        self.info = info
        self.walked = [0] * len(draft_lens)
        self.proposals: dict[int, list[int]] = {}
        start = 0
        for i, k in enumerate(draft_lens):
            if info.grammars[i] is not None and k:
                self.proposals[i] = inputs[start + 1 : start + 1 + k]
            start += k + 1

    def mask(self, j: int, logits: torch.Tensor) -> None:
        """Mask position j's `[bs, vocab]` logits: rows with a j-th proposal, their grammar past
        it (the speculator checked that it accepts it)."""
        grammars: list[Grammar] = []
        rows: list[int] = []
        for i, tokens in self.proposals.items():
            grammar = self.info.grammars[i]
            if j <= len(tokens) and grammar.accept_token(tokens[j - 1]):
                self.walked[i] += 1
                if not grammar.is_terminated():
                    grammars.append(grammar)
                    rows.append(i)
        if grammars:
            pending = grammars[0].backend.start_token_bitmask(
                grammars, rows, len(self.walked), pinned=logits.device.type == "cuda"
            )
            pending.wait(logits.device).apply(logits)

    def rollback(self) -> None:
        for i, n in enumerate(self.walked):
            if n:
                self.info.grammars[i].rollback(n)
        self.walked = [0] * len(self.walked)


def _picks(
    logits: torch.Tensor,
    rows: torch.Tensor,
    info: SamplingBatchInfo,
    walk: GrammarWalk | None,
    proposals: torch.Tensor,
) -> torch.Tensor:
    """`[bs, K + 1]`: the target's token at each position, as the Sampler would pick it.
    Penalties past position 0 come from a copy of the state that takes the proposals (a row
    past its own proposals takes token 0: its picks there are never emitted)."""
    picks = []
    penalties = None
    for j in range(rows.shape[1]):
        step_logits = logits[rows[:, j]]  # a copy: the processors change it in place
        if j == 0:
            info.apply_logits_processors(step_logits)
        else:
            if not info.penalizers.is_empty:
                penalties = penalties or copy.deepcopy(info.penalizers)
                penalties.update(proposals[:, j - 1].clamp(min=0))
                penalties.apply(step_logits, info.num_generated + j)
            if walk is not None:
                walk.mask(j, step_logits)
        if info.is_all_greedy:
            picks.append(argmax(step_logits))
        else:
            picks.append(sample_rows(step_logits, info, step_offset=j))
    return torch.stack(picks, dim=1)


def _top_logprobs(
    raw: torch.Tensor, nums: list[int], positions: int
) -> list[list[list[tuple[int, float]]]]:
    """Per row and position, the row's `nums[i]` most likely (id, logprob), best first."""
    k = min(max(nums, default=0), raw.shape[-1])
    if k == 0:
        return [[[] for _ in range(positions)] for _ in nums]
    values, ids = raw.topk(k, dim=-1, sorted=True)
    values = values.view(len(nums), positions, k).tolist()
    ids = ids.view(len(nums), positions, k).tolist()
    return [
        [list(zip(ids[i][j][:num], values[i][j][:num], strict=True)) for j in range(positions)]
        for i, num in enumerate(nums)
    ]
