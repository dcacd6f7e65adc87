"""The scheduler's side of speculative decoding: who proposes, how far, and what a verify
step's outcome does to a request.

Per step, `plan` decides for the running batch:
- nothing at all when the batch has more than `--speculative-max-batch-size` requests: there the
  step is compute-bound, scoring k + 1 positions per request costs about k + 1 decode steps, and
  plain decode (CUDA graphs, overlap) wins. Nothing runs on the normal path then (and nothing
  when speculation is off: the scheduler holds no speculator);
- per request a budget: `--speculative-num-tokens`, bounded by what the request may still
  generate, its context, and its own acceptance (adaptive: a request whose proposals keep being
  rejected proposes fewer, down to none, and probes again with one after a pause; one whose
  proposals are all kept proposes twice as many next time, up to k); a
  constrained request's proposals stop at the first token its grammar refuses (the matcher
  walks them and is rolled back); a grammar that cannot roll back proposes nothing (its row
  decodes one token, exactly);
- the proposals trimmed to the free KV slots (the verify step writes KV for every position).
A batch where nothing was proposed runs as a plain decode step.

`settle` takes a verify step's outcome for one request: how many of its proposals were kept
(counters, adaptive state, the proposer told) and which KV slots to give back.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from radixserve.speculative.draft import DraftProposer
from radixserve.speculative.ngram import NgramProposer
from radixserve.speculative.proposer import Proposer, TokenHistory

if TYPE_CHECKING:
    from radixserve.sampling.sampling_params import SamplingParams
    from radixserve.server_args import ServerArgs

# adaptive per request: an exponential average of the fraction of proposals kept
ACCEPT_EMA_WEIGHT = 0.3
LOW_ACCEPTANCE = 0.25  # below this the request's budget halves
PROBE_AFTER_STEPS = 16  # a request turned down to 0 proposes 1 token again after this many


class Req(Protocol):
    """What the speculator reads of a request (scheduler/schedule_batch.Req)."""

    rid: str
    origin_input_ids: list[int]
    output_ids: list[int]
    sampling_params: SamplingParams
    grammar: Any
    future_id: int | None

    @property
    def seqlen(self) -> int: ...


@dataclass
class RequestSpec:
    """One request's speculation state (kept while the request lives)."""

    history: TokenHistory
    budget: int
    acceptance: float = 1.0
    idle_steps: int = 0
    proposed: int = 0  # in the verify step in flight


@dataclass
class SpecCounters:
    """Totals since the last report (scheduler_stats turns them into SchedulerStats)."""

    proposed_tokens: int = 0
    accepted_tokens: int = 0
    # tokens each verified request emitted in one step (accepted + 1)
    acceptance_lengths: list[int] = field(default_factory=list)

    def pop(self) -> SpecCounters:
        out = SpecCounters(self.proposed_tokens, self.accepted_tokens, self.acceptance_lengths)
        self.proposed_tokens = self.accepted_tokens = 0
        self.acceptance_lengths = []
        return out


def build_proposer(server_args: ServerArgs, max_requests: int) -> Proposer:
    """The proposer `--speculative-method` names (`max_requests`: the target's rows)."""
    if server_args.speculative_method == "ngram":
        return NgramProposer(server_args.speculative_ngram_min, server_args.speculative_ngram_max)
    if server_args.speculative_method == "draft":
        return DraftProposer(server_args, max_requests)
    raise ValueError(f"unknown speculative method {server_args.speculative_method!r}")


def speculates_exactly(req: Req) -> bool:
    """Whether the verify step reproduces this request's sampling at every position: not with
    a grammar that cannot roll back (its mask depends on the tokens before: verify.py walks the
    matcher through them); such a row decodes one token in the verify step."""
    return req.grammar is None or req.grammar.can_rollback


def grammar_prefix(grammar: Any, tokens: list[int]) -> list[int]:
    """The longest prefix of `tokens` the grammar accepts (its matcher walked and rolled back):
    a proposal the grammar refuses could never be sampled."""
    taken = 0
    for token in tokens:
        if grammar.is_terminated() or not grammar.accept_token(token):
            break
        taken += 1
    grammar.rollback(taken)
    return tokens[:taken]


class Speculator:
    def __init__(self, server_args: ServerArgs, proposer: Proposer, context_len: int) -> None:
        self.num_tokens = server_args.speculative_num_tokens
        self.max_batch_size = server_args.speculative_max_batch_size
        self.proposer = proposer
        self.context_len = context_len
        self.counters = SpecCounters()  # since the last report
        self.total = SpecCounters()  # since the start (acceptance_lengths unused)
        # per request, dropped with it (no bookkeeping to leak on any exit path)
        self._state: weakref.WeakKeyDictionary[Req, RequestSpec] = weakref.WeakKeyDictionary()

    def info(self) -> dict[str, object]:
        """For server info: the settings and the totals since the start."""
        total = self.total
        return {
            "speculative_num_tokens": self.num_tokens,
            "speculative_max_batch_size": self.max_batch_size,
            "spec_proposed_tokens": total.proposed_tokens,
            "spec_accepted_tokens": total.accepted_tokens,
        }

    def active(self, batch_size: int) -> bool:
        """Whether a decode step of this many requests speculates at all."""
        return 0 < batch_size <= self.max_batch_size

    def plan(self, reqs: Sequence[Req], spare_slots: int) -> list[list[int]] | None:
        """Proposals per request for the next step (None: run a plain decode step). At most
        `spare_slots` tokens in all (the KV the batch can still take beyond one per request)."""
        if not self.active(len(reqs)):
            return None
        budgets = [self._budget(req) for req in reqs]
        if not any(budgets):
            return None
        chosen = [i for i, b in enumerate(budgets) if b]
        proposals = self.proposer.propose(
            [reqs[i].rid for i in chosen],
            [self._state[reqs[i]].history for i in chosen],
            [budgets[i] for i in chosen],
        )
        drafts: list[list[int]] = [[] for _ in reqs]
        for i, tokens in zip(chosen, proposals, strict=True):
            if not tokens:  # no guess: counted as a proposal all rejected
                self._learn(self._state[reqs[i]], budgets[i], 0)
            tokens = list(tokens[: max(spare_slots, 0)])
            if reqs[i].grammar is not None:
                tokens = grammar_prefix(reqs[i].grammar, tokens)
            drafts[i] = tokens
            spare_slots -= len(tokens)
        for req, tokens in zip(reqs, drafts, strict=True):
            state = self._state.get(req)
            if state is not None:
                state.proposed = len(tokens)
        return drafts if any(drafts) else None

    def may_propose(self, reqs: Sequence[Req]) -> bool:
        """Whether some of these requests may propose at the next step, which then needs their
        tokens so far (the scheduler resolves the batch in flight first). A request turned down
        to no proposals does not, until its probe is due: then overlap goes on."""
        if not self.active(len(reqs)):
            return False
        for req in reqs:
            if speculates_exactly(req):
                state = self._state.get(req)
                if state is None or state.budget or state.idle_steps + 1 >= PROBE_AFTER_STEPS:
                    return True
        return False

    def _budget(self, req: Req) -> int:
        """How many tokens this request may propose now (0: none)."""
        if not speculates_exactly(req):
            return 0
        state = self._state.get(req)
        if state is None:
            state = RequestSpec(TokenHistory(req.origin_input_ids), self.num_tokens)
            self._state[req] = state
            weakref.finalize(req, self.proposer.release, req.rid)
        if state.budget == 0:
            state.idle_steps += 1
            if state.idle_steps < PROBE_AFTER_STEPS or req.future_id is not None:
                return 0
            state.budget, state.idle_steps, state.acceptance = 1, 0, LOW_ACCEPTANCE
        if req.future_id is not None:  # its last token is still in flight
            return 0
        seen = len(state.history) - len(req.origin_input_ids)
        if seen < len(req.output_ids):
            state.history.extend(req.output_ids[seen:])
        # the last emitted token may be the (max_new_tokens)-th: proposals past it are waste
        left = req.sampling_params.max_new_tokens - len(req.output_ids) - 1
        room = self.context_len - req.seqlen - 1
        return max(0, min(state.budget, left, room))

    def _learn(self, state: RequestSpec, proposed: int, accepted: int) -> None:
        """Adapt the request's budget: doubled after a step that kept everything (a copied
        run found after a turn-down is back at k within a few steps, where one more a step
        took k of them), halved while its average acceptance is low."""
        state.acceptance += ACCEPT_EMA_WEIGHT * (accepted / proposed - state.acceptance)
        if accepted == proposed:
            state.budget = min(self.num_tokens, max(1, 2 * state.budget))
        elif state.acceptance < LOW_ACCEPTANCE:
            state.budget //= 2

    def settle(self, req: Req, emitted: int, accepted: int) -> int:
        """A verify step kept `accepted` proposals of `req` and it took `emitted` tokens of the
        step's (fewer than accepted + 1 when it stopped midway). Returns the request's KV length
        afterwards: its tokens up to the last kept proposal (those after are given back)."""
        state = self._state.get(req)
        proposed = state.proposed if state is not None else 0
        if state is not None:
            self.proposer.on_verified(req.rid, proposed, accepted)
        if state is not None and proposed:
            self.counters.proposed_tokens += proposed
            self.counters.accepted_tokens += accepted
            self.counters.acceptance_lengths.append(accepted + 1)
            self.total.proposed_tokens += proposed
            self.total.accepted_tokens += accepted
            self._learn(state, proposed, accepted)
            state.proposed = 0
        # KV was written for the last token before the step and each proposal; the emitted
        # tokens past the accepted ones (the target's own) have none yet
        before = req.seqlen - emitted  # tokens before the step (its last one included)
        return before + min(emitted, accepted)
