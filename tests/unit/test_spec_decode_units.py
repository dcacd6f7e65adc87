"""Speculative decoding's parts alone: prompt lookup (hypothesis), and the verify step's
acceptance: greedy = the longest matching prefix plus the target's token; sampled rows keep
the target's distribution exactly (a chi-square bound over many seeds) with the acceptance
rate p(d) that Leviathan et al.'s rule gives a one-token proposal."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.sampling.sampling_batch_info import SamplingBatchInfo
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.server_args import ServerArgs
from radixserve.speculative.ngram import lookup
from radixserve.speculative.proposer import TokenHistory
from radixserve.speculative.speculator import PROBE_AFTER_STEPS, Speculator
from radixserve.speculative.verify import verify


class _Req:
    def __init__(self, params: SamplingParams) -> None:
        self.sampling_params = params
        self.output_ids: list[int] = []
        self.origin_input_ids = [0]
        self.grammar = None


def batch_info(params: list[SamplingParams], vocab: int) -> SamplingBatchInfo:
    return SamplingBatchInfo.from_reqs([_Req(p) for p in params], vocab, "cpu", set())


def naive_lookup(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The rule, written plainly: longest suffix first, the latest earlier occurrence with k
    tokens after it, else the latest."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n :]
        starts = [p for p in range(length - n) if tokens[p : p + n] == suffix]
        if starts:
            full = [p for p in starts if p + n + k <= length]
            p = (full or starts)[-1]
            return tokens[p + n : p + n + k]
    return []


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 4), min_size=1, max_size=60),
    k=st.integers(1, 6),
    min_n=st.integers(1, 3),
    extra=st.integers(0, 3),
)
def test_lookup_is_the_plain_rule(tokens, k, min_n, extra):
    got = lookup(np.array(tokens, dtype=np.int64), k, min_n, min_n + extra)
    assert got == naive_lookup(tokens, k, min_n, min_n + extra)


@given(parts=st.lists(st.lists(st.integers(0, 9), max_size=7), max_size=12))
def test_history_grows_as_appended(parts):
    history = TokenHistory([])
    flat: list[int] = []
    for part in parts:
        history.extend(part)
        flat += part
    assert history.view().tolist() == flat


def test_greedy_accepts_the_longest_matching_prefix():
    vocab = 8
    # three requests: proposals [3, 5, 6], [2], none; the target's argmax per position below
    targets = [[3, 5, 1, 7], [4, 0], [6]]
    proposals = [[3, 5, 6], [2], []]
    rows, ids = [], []
    for last, (target, draft) in enumerate(zip(targets, proposals, strict=True)):
        ids += [last, *draft]
        rows += [torch.nn.functional.one_hot(torch.tensor(t), vocab).float() * 5 for t in target]
    info = batch_info([SamplingParams(temperature=0.0)] * 3, vocab)
    out = verify(torch.stack(rows), ids, [3, 1, 0], info)
    assert out.num_accepted.tolist() == [2, 0, 0]
    counts = out.num_accepted.tolist()
    emitted = [row[: m + 1] for row, m in zip(out.tokens.tolist(), counts, strict=True)]
    assert emitted == [[3, 5, 1], [4], [6]]


def chi_square_upper(df: int) -> float:
    """A bound the chi-square statistic exceeds with probability well under 1e-4 (Wilson-
    Hilferty: mean df, the 99.99th percentile at about z = 3.72)."""
    z = 3.72
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_sampled_rows_keep_the_target_distribution():
    """N rows with different seeds, one proposal each (d, the target's second likeliest token)
    and one bonus position: the first emitted token is distributed as p (top-k filtered,
    temperature applied), d is accepted with probability p(d), and the bonus token after an
    acceptance follows the second position's distribution."""
    n, vocab = 6000, 6
    torch.manual_seed(0)
    first_logits, second_logits = torch.randn(vocab) * 1.5, torch.randn(vocab)
    params = [
        SamplingParams(temperature=0.8, top_k=4, seed=seed, max_new_tokens=8) for seed in range(n)
    ]
    info = batch_info(params, vocab)
    d = int(first_logits.topk(2).indices[1])
    logits = torch.stack([first_logits, second_logits] * n)
    out = verify(logits, [0, d] * n, [1] * n, info)

    def target(raw: torch.Tensor) -> torch.Tensor:
        scaled = raw / 0.8
        kth = scaled.topk(4).values[-1]
        return torch.softmax(scaled.masked_fill(scaled < kth, float("-inf")), dim=-1)

    p1, p2 = target(first_logits), target(second_logits)
    accepted = out.num_accepted.numpy() == 1
    first = out.tokens[:, 0].numpy()
    counts = np.bincount(first, minlength=vocab)
    support = p1.numpy() > 0
    expected = p1.numpy() * n
    stat = (((counts - expected) ** 2)[support] / expected[support]).sum()
    assert stat < chi_square_upper(int(support.sum()) - 1)
    assert counts[~support].sum() == 0
    # acceptance is exactly "the target's sample is the proposal": rate p(d)
    assert np.array_equal(accepted, first == d)
    rate, p_d = accepted.mean(), float(p1[d])
    assert abs(rate - p_d) < 4 * math.sqrt(p_d * (1 - p_d) / n)
    bonus = np.bincount(out.tokens[accepted, 1].numpy(), minlength=vocab)
    m = accepted.sum()
    keep = p2.numpy() > 0
    stat2 = (((bonus - p2.numpy() * m) ** 2)[keep] / (p2.numpy() * m)[keep]).sum()
    assert stat2 < chi_square_upper(int(keep.sum()) - 1)


class _SpecReq:
    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.origin_input_ids = [1, 2, 3]
        self.output_ids = [4]
        self.sampling_params = SamplingParams(max_new_tokens=1000, temperature=0.0)
        self.grammar = None
        self.future_id = None

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)


class _Fixed:
    """Proposes `tokens` (possibly none) for every request."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def propose(self, rids, histories, budgets):
        return [self.tokens[:b] for b in budgets]

    def on_verified(self, rid, proposed, accepted):
        pass

    def release(self, rid):
        pass


def test_speculation_turns_itself_down_and_probes_again():
    """Proposals that never match (or none at all) halve a request's budget down to zero; then
    the request needs no synced step (overlap goes on) until a one-token probe is due."""
    args = ServerArgs(speculative_method="ngram", speculative_max_batch_size=4)
    for proposer in (_Fixed([9, 9, 9, 9]), _Fixed([])):
        spec = Speculator(args, proposer, context_len=4096)
        req = _SpecReq("a")
        assert spec.may_propose([req])
        budgets = []
        for _ in range(12):
            drafts = spec.plan([req], spare_slots=100)
            budgets.append(len(drafts[0]) if drafts else 0)
            if drafts:
                req.output_ids.append(5)
                spec.settle(req, emitted=1, accepted=0)
        assert budgets[0] == (4 if proposer.tokens else 0) and 0 in budgets
        turned_down = budgets.index(0) if proposer.tokens else 0
        assert all(b == 0 for b in budgets[turned_down:])
        quiet = 0  # plain steps (no sync needed) until the probe is due
        while not spec.may_propose([req]):
            assert spec.plan([req], spare_slots=100) is None
            quiet += 1
            assert quiet < PROBE_AFTER_STEPS
        assert quiet > 0
        probe = spec.plan([req], spare_slots=100)
        assert probe == ([[9]] if proposer.tokens else None)
        fresh = _SpecReq("b")
        assert spec.may_propose([fresh] * 4) and not spec.may_propose([fresh] * 5)  # batch limit


def test_speculation_turns_itself_up_to_k_when_all_is_kept():
    """A request turned down to its one-token probe whose proposals are then all kept doubles
    its budget each step, up to k (`--speculative-num-tokens`), and stays there."""
    args = ServerArgs(speculative_method="ngram", speculative_num_tokens=16)
    spec = Speculator(args, _Fixed([7] * 16), context_len=4096)
    req = _SpecReq("a")
    budgets = []
    while len(budgets) < 3 or budgets[-1]:  # rejected until turned down to none
        drafts = spec.plan([req], spare_slots=100)
        budgets.append(len(drafts[0]) if drafts else 0)
        if drafts:
            req.output_ids.append(5)
            spec.settle(req, emitted=1, accepted=0)
    assert budgets[0] == 16
    while (drafts := spec.plan([req], spare_slots=100)) is None:  # until the probe
        pass
    budgets = []
    for _ in range(7):
        budgets.append(len(drafts[0]))
        req.output_ids += [7] * (len(drafts[0]) + 1)
        spec.settle(req, emitted=len(drafts[0]) + 1, accepted=len(drafts[0]))
        drafts = spec.plan([req], spare_slots=100)
    assert budgets == [1, 2, 4, 8, 16, 16, 16]
