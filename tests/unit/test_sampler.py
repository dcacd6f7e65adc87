"""Sampler + SamplingBatchInfo + penalties, against straightforward references.

Statistical checks use fixed seeds, so every run draws the same tokens (no flakiness); many
draws are made at once as many rows of one batch, each with its own seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from radixserve.layers.sampler import Sampler, allowed_tokens
from radixserve.sampling.penalties import (
    FrequencyPresencePenalizer,
    MinNewTokensPenalizer,
    RepetitionPenalizer,
)
from radixserve.sampling.sampling_batch_info import SamplingBatchInfo, fmix32
from radixserve.sampling.sampling_params import SamplingParams

VOCAB = 64
EOS = 2


@dataclass
class FakeReq:
    sampling_params: SamplingParams
    origin_input_ids: list[int] = field(default_factory=lambda: [5, 6, 7])
    output_ids: list[int] = field(default_factory=list)
    grammar: None = None


def batch(reqs: list[FakeReq], vocab: int = VOCAB) -> SamplingBatchInfo:
    return SamplingBatchInfo.from_reqs(reqs, vocab, "cpu", {EOS})


def draws(params: SamplingParams, logits_row: torch.Tensor, n: int) -> torch.Tensor:
    """`n` tokens sampled from one logits row, one per seed 0..n-1."""
    reqs = [
        FakeReq(SamplingParams(**{**params.__dict__, "seed": seed}), origin_input_ids=[])
        for seed in range(n)
    ]
    logits = logits_row.expand(n, -1).clone()
    return Sampler()(logits, batch(reqs, logits_row.numel())).next_token_ids


@pytest.fixture
def sampler() -> Sampler:
    return Sampler()


def test_greedy_is_argmax(sampler):
    torch.manual_seed(0)
    logits = torch.randn(16, VOCAB)
    info = batch([FakeReq(SamplingParams(temperature=0.0)) for _ in range(16)])
    assert info.is_all_greedy
    out = sampler(logits.clone(), info)
    assert out.next_token_ids.dtype == torch.int64
    assert torch.equal(out.next_token_ids, torch.argmax(logits, dim=-1))


def test_mixed_batch_greedy_rows_take_argmax(sampler):
    torch.manual_seed(1)
    logits = torch.randn(6, VOCAB)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.5, seed=1),
        SamplingParams(top_k=1, temperature=0.9),
        SamplingParams(temperature=2.0, top_p=0.5, seed=2),
        SamplingParams(temperature=0.0),
        SamplingParams(min_p=0.2, seed=3),
    ]
    info = batch([FakeReq(p) for p in params])
    assert not info.is_all_greedy
    out = sampler(logits.clone(), info).next_token_ids
    argmax = torch.argmax(logits, dim=-1)
    for row in (0, 2, 4):
        assert out[row] == argmax[row]


def test_top_k_never_samples_outside_the_k_best():
    torch.manual_seed(2)
    logits = torch.randn(VOCAB) * 0.3  # flat: without the filter most tokens would appear
    tokens = draws(SamplingParams(top_k=5), logits, 3000)
    allowed = set(torch.topk(logits, 5).indices.tolist())
    assert set(tokens.tolist()) == allowed


def test_top_p_never_samples_outside_the_nucleus():
    torch.manual_seed(3)
    logits = torch.randn(VOCAB) * 2.0
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, order = probs.sort(descending=True)
    mass_before = torch.cumsum(sorted_probs, 0) - sorted_probs
    nucleus = set(order[mass_before < 0.6].tolist())
    assert 2 < len(nucleus) < VOCAB // 2
    tokens = draws(SamplingParams(top_p=0.6), logits, 3000)
    assert set(tokens.tolist()) == nucleus


def test_top_p_applies_to_top_k_survivors_renormalized():
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    # Over the top-2, renormalized: 4/7 then 3/7; top_p 0.5 keeps only the first.
    tokens = draws(SamplingParams(top_k=2, top_p=0.5), logits, 500)
    assert set(tokens.tolist()) == {0}
    # Top-p alone at 0.5 keeps 0 and 1 (0.4 before reaching 0.5).
    tokens = draws(SamplingParams(top_p=0.5), logits, 500)
    assert set(tokens.tolist()) == {0, 1}


def test_min_p_never_samples_below_the_threshold():
    torch.manual_seed(4)
    logits = torch.randn(VOCAB) * 1.5
    probs = torch.softmax(logits, dim=-1)
    allowed = set(torch.nonzero(probs >= 0.3 * probs.max()).flatten().tolist())
    assert 1 < len(allowed) < VOCAB // 2
    tokens = draws(SamplingParams(min_p=0.3), logits, 3000)
    assert set(tokens.tolist()) == allowed


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_sampling_frequencies_follow_the_tempered_distribution(temperature):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, -3.0])
    n = 20000
    tokens = draws(SamplingParams(temperature=temperature), logits, n)
    observed = torch.bincount(tokens, minlength=logits.numel()).double() / n
    expected = torch.softmax(logits.double() / temperature, dim=-1)
    # Binomial std of a frequency is at most 0.5 / sqrt(n) = 0.0035; allow about 4 sigma.
    assert torch.allclose(observed, expected, atol=0.015), (observed, expected)


def run_steps(
    sampler: Sampler, reqs: list[FakeReq], row: int, steps: list[torch.Tensor]
) -> list[int]:
    """Decode `len(steps)` steps of a batch; every row gets the same logits per step. Returns
    the tokens of row `row`."""
    info = batch(reqs)
    tokens = []
    for step_logits in steps:
        logits = step_logits.expand(len(reqs), -1).clone()
        next_ids = sampler(logits, info).next_token_ids
        info.update_with_new_tokens(next_ids)
        tokens.append(int(next_ids[row]))
    return tokens


def test_seeded_request_reproducible_across_batch_composition_and_position(sampler):
    torch.manual_seed(5)
    steps = [torch.randn(VOCAB) * 0.5 for _ in range(8)]
    target = SamplingParams(temperature=0.8, top_p=0.95, repetition_penalty=1.3, seed=1234)
    alone = run_steps(sampler, [FakeReq(target)], 0, steps)
    others = [
        FakeReq(SamplingParams(temperature=0.0)),
        FakeReq(SamplingParams(top_k=3, min_p=0.1)),
        FakeReq(SamplingParams(frequency_penalty=1.0, presence_penalty=-0.5, seed=9)),
        FakeReq(SamplingParams(min_new_tokens=4, top_p=0.5)),
    ]
    first = run_steps(sampler, [FakeReq(target), *others], 0, steps)
    third = run_steps(sampler, [others[1], others[0], FakeReq(target), *others[2:]], 2, steps)
    assert alone == first == third
    assert len(set(alone)) > 1  # it really sampled


def test_different_seeds_and_unseeded_requests_differ(sampler):
    steps = [torch.zeros(VOCAB)] * 6  # uniform: every sequence is equally likely
    seeded = [run_steps(sampler, [FakeReq(SamplingParams(seed=s))], 0, steps) for s in (1, 2)]
    assert seeded[0] != seeded[1]
    unseeded = [run_steps(sampler, [FakeReq(SamplingParams())], 0, steps) for _ in range(2)]
    assert unseeded[0] != unseeded[1]


def test_resumed_request_continues_its_seeded_stream(sampler):
    """A request retracted after 3 tokens and rebuilt from its output_ids draws what it would
    have drawn without the interruption."""
    torch.manual_seed(6)
    steps = [torch.randn(VOCAB) * 0.5 for _ in range(6)]
    params = SamplingParams(temperature=1.0, frequency_penalty=0.7, repetition_penalty=1.2, seed=7)
    full = run_steps(sampler, [FakeReq(params)], 0, steps)
    resumed = run_steps(sampler, [FakeReq(params, output_ids=full[:3])], 0, steps[3:])
    assert resumed == full[3:]


def reference_frequency_presence(
    logits: torch.Tensor, outputs: list[list[int]], freq: list[float], pres: list[float]
) -> torch.Tensor:
    expected = logits.clone()
    for row, generated in enumerate(outputs):
        for token in set(generated):
            count = generated.count(token)
            expected[row, token] -= freq[row] * count + pres[row]
    return expected


def test_frequency_and_presence_penalties_match_reference():
    torch.manual_seed(7)
    outputs = [[1, 1, 1, 4], [], [9, 3, 9], [4]]
    freq, pres = [0.5, 1.0, -0.3, 0.0], [0.2, 0.0, 1.5, 0.0]
    reqs = [
        FakeReq(SamplingParams(frequency_penalty=f, presence_penalty=p), output_ids=o)
        for f, p, o in zip(freq, pres, outputs, strict=True)
    ]
    info = batch(reqs)
    logits = torch.randn(4, VOCAB)
    penalized = logits.clone()
    info.apply_logits_processors(penalized)
    expected = reference_frequency_presence(logits, outputs, freq, pres)
    torch.testing.assert_close(penalized, expected)

    # After a step the new tokens count too.
    new_tokens = [4, 5, 9, 4]
    info.update_with_new_tokens(torch.tensor(new_tokens))
    penalized = logits.clone()
    info.apply_logits_processors(penalized)
    grown = [o + [t] for o, t in zip(outputs, new_tokens, strict=True)]
    torch.testing.assert_close(penalized, reference_frequency_presence(logits, grown, freq, pres))


def test_repetition_penalty_matches_transformers_exactly():
    torch.manual_seed(8)
    prompts = [[3, 10, 10, 11], [20, 21], [30]]
    outputs = [[12], [], [31, 3]]
    penalties = [1.3, 0.7, 2.0]
    reqs = [
        FakeReq(SamplingParams(repetition_penalty=r), origin_input_ids=p, output_ids=o)
        for r, p, o in zip(penalties, prompts, outputs, strict=True)
    ]
    info = batch(reqs)
    logits = torch.randn(3, VOCAB) * 3
    logits[0, 10] = -2.0  # make sure both signs are covered on seen tokens
    logits[0, 3] = 2.0
    penalized = logits.clone()
    info.apply_logits_processors(penalized)
    for row in range(3):
        input_ids = torch.tensor([prompts[row] + outputs[row]])
        processor = RepetitionPenaltyLogitsProcessor(penalty=penalties[row])
        expected = processor(input_ids, logits[row : row + 1].clone())
        assert torch.equal(penalized[row], expected[0])


def test_min_new_tokens_masks_eos_and_stop_tokens_until_reached(sampler):
    params = SamplingParams(min_new_tokens=2, stop_token_ids=[9], temperature=0.0)
    info = batch([FakeReq(params), FakeReq(SamplingParams(temperature=0.0))])
    logits = torch.zeros(2, VOCAB)
    logits[:, EOS] = 10.0
    logits[:, 9] = 9.0
    logits[:, 4] = 8.0
    # Step 0 and 1: EOS and 9 forbidden for row 0; row 1 (no minimum) may stop.
    for _ in range(2):
        out = sampler(logits.clone(), info).next_token_ids
        assert out.tolist() == [4, EOS]
        info.update_with_new_tokens(out)
    # Minimum reached: EOS allowed again.
    assert sampler(logits.clone(), info).next_token_ids.tolist() == [EOS, EOS]


def test_min_new_tokens_leaves_eos_alone_with_ignore_eos():
    info = batch([FakeReq(SamplingParams(min_new_tokens=3, ignore_eos=True, stop_token_ids=[9]))])
    logits = torch.zeros(1, VOCAB)
    info.apply_logits_processors(logits)
    assert logits[0, 9] == float("-inf")
    assert torch.isfinite(logits[0, EOS])


def test_min_new_tokens_counts_already_generated_tokens():
    info = batch([FakeReq(SamplingParams(min_new_tokens=2), output_ids=[1, 1])])
    logits = torch.zeros(1, VOCAB)
    info.apply_logits_processors(logits)
    assert torch.isfinite(logits).all()


def test_logit_bias_forces_bans_and_leaves_other_rows_alone(sampler):
    torch.manual_seed(3)
    logits = torch.randn(5, VOCAB) * 3
    best = logits.argmax(dim=-1)
    worst = logits.argmin(dim=-1)
    second = logits.topk(2, dim=-1).indices[:, 1]
    params = [
        SamplingParams(temperature=0.0, logit_bias={worst[0].item(): 100}),  # forced
        SamplingParams(temperature=0.0, logit_bias={best[1].item(): -100}),  # banned
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, seed=4, logit_bias={worst[3].item(): 100}),
        SamplingParams(temperature=1.0, seed=5),
    ]
    out = sampler(logits.clone(), batch([FakeReq(p) for p in params])).next_token_ids
    assert out[0] == worst[0] and out[1] == second[1] and out[3] == worst[3]
    unbiased = sampler(logits[[2, 4]].clone(), batch([FakeReq(params[2]), FakeReq(params[4])]))
    assert out[[2, 4]].tolist() == unbiased.next_token_ids.tolist()


def test_logit_bias_adds_to_the_named_logits_only():
    info = batch([FakeReq(SamplingParams(logit_bias={3: 2.5, 0: -1.0})), FakeReq(SamplingParams())])
    logits = torch.zeros(2, VOCAB)
    info.apply_logits_processors(logits)
    expected = torch.zeros(2, VOCAB)
    expected[0, 3], expected[0, 0] = 2.5, -1.0
    assert torch.equal(logits, expected)


def test_penalty_state_allocated_only_when_needed():
    plain = batch([FakeReq(SamplingParams(temperature=0.5, top_k=4)) for _ in range(3)])
    assert plain.penalizers.is_empty
    some = batch([FakeReq(SamplingParams()), FakeReq(SamplingParams(presence_penalty=0.5))])
    assert set(some.penalizers.active) == {FrequencyPresencePenalizer}


DIVERSE_PARAMS = [
    SamplingParams(temperature=0.0, seed=1),
    SamplingParams(temperature=0.7, top_k=5, seed=2, repetition_penalty=1.4),
    SamplingParams(top_p=0.8, seed=3, frequency_penalty=0.5, logit_bias={4: 1.5, 9: -3.0}),
    SamplingParams(min_p=0.1, seed=4, min_new_tokens=3, stop_token_ids=[11]),
    SamplingParams(temperature=1.3, seed=5, presence_penalty=-1.0, logit_bias={2: 7.0}),
    SamplingParams(seed=6),
]


def assert_same_rows(actual: SamplingBatchInfo, expected: SamplingBatchInfo) -> None:
    """Every per-row tensor and flag of `actual` equals `expected`'s (penalty kinds that only one
    side holds must be neutral there)."""
    assert actual.sampling_params == expected.sampling_params
    for name in ("temperatures", "top_ps", "top_ks", "min_ps", "greedy", "seed_keys"):
        assert torch.equal(getattr(actual, name), getattr(expected, name)), name
    assert torch.equal(actual.num_generated, expected.num_generated)
    flags = ("is_all_greedy", "need_top_k", "need_top_p", "need_min_p")
    assert [getattr(actual, f) for f in flags] == [getattr(expected, f) for f in flags]
    torch.manual_seed(9)
    logits = torch.randn(actual.batch_size, VOCAB) * 2
    left, right = logits.clone(), logits.clone()
    actual.apply_logits_processors(left)
    expected.apply_logits_processors(right)
    assert torch.equal(left, right)


def test_filter_keeps_rows_aligned():
    reqs = [FakeReq(p, output_ids=[i, i + 1]) for i, p in enumerate(DIVERSE_PARAMS)]
    info = batch(reqs)
    keep = [4, 1, 3]
    info.filter_batch(keep)
    assert_same_rows(info, batch([reqs[i] for i in keep]))


def test_filter_drops_penalty_state_no_one_needs():
    info = batch([FakeReq(DIVERSE_PARAMS[1]), FakeReq(DIVERSE_PARAMS[5])])
    assert RepetitionPenalizer in info.penalizers.active
    info.filter_batch([1])
    assert info.penalizers.is_empty


def test_merge_keeps_rows_aligned_across_different_penalty_kinds():
    reqs = [FakeReq(p, output_ids=[i]) for i, p in enumerate(DIVERSE_PARAMS)]
    left, right = batch(reqs[:3]), batch(reqs[3:])
    assert MinNewTokensPenalizer not in left.penalizers.active
    assert RepetitionPenalizer not in right.penalizers.active
    left.merge_batch(right)
    assert_same_rows(left, batch(reqs))


def test_filter_and_merge_keep_penalty_counts_in_step():
    """Tokens generated before a filter/merge still count afterwards, on the right rows."""
    reqs = [FakeReq(p) for p in DIVERSE_PARAMS]
    info = batch(reqs[:4])
    first = torch.tensor([1, 2, 3, 4])
    info.update_with_new_tokens(first)
    for req, token in zip(reqs[:4], first.tolist(), strict=True):
        req.output_ids.append(token)
    info.filter_batch([3, 1, 2])
    info.merge_batch(batch(reqs[4:]))
    order = [3, 1, 2, 4, 5]
    assert_same_rows(info, batch([reqs[i] for i in order]))


def test_logprobs_are_log_softmax_of_raw_logits(sampler):
    torch.manual_seed(10)
    logits = torch.randn(3, VOCAB) * 2
    params = [
        SamplingParams(temperature=0.0, repetition_penalty=1.8),
        SamplingParams(temperature=0.5, frequency_penalty=2.0, seed=1),
        SamplingParams(top_k=3, seed=2),
    ]
    reqs = [FakeReq(p, origin_input_ids=list(range(0, VOCAB, 2)), output_ids=[1]) for p in params]
    out = sampler(logits.clone(), batch(reqs), return_logprob=True, top_logprobs_nums=[2, 0, 5])
    raw = torch.log_softmax(logits, dim=-1)
    torch.testing.assert_close(out.logprobs, raw.gather(1, out.next_token_ids[:, None])[:, 0])
    assert out.top_logprobs[1] == []
    for row, k in ((0, 2), (2, 5)):
        alternatives = out.top_logprobs[row]
        assert len(alternatives) == k
        values = [lp for _, lp in alternatives]
        assert values == sorted(values, reverse=True)
        assert [t for t, _ in alternatives] == torch.topk(raw[row], k).indices.tolist()
        torch.testing.assert_close(torch.tensor(values), torch.topk(raw[row], k).values)


def test_no_logprobs_unless_asked(sampler):
    out = sampler(torch.randn(2, VOCAB), batch([FakeReq(SamplingParams()) for _ in range(2)]))
    assert out.logprobs is None and out.top_logprobs is None


def test_bfloat16_logits_are_accepted(sampler):
    torch.manual_seed(11)
    logits = torch.randn(2, VOCAB).to(torch.bfloat16)
    reqs = [FakeReq(SamplingParams(temperature=0.0)), FakeReq(SamplingParams(seed=1))]
    out = sampler(logits, batch(reqs), return_logprob=True)
    assert out.next_token_ids[0] == torch.argmax(logits.float()[0])
    assert out.logprobs.dtype == torch.float32


def test_empty_batch(sampler):
    info = batch([])
    out = sampler(torch.empty(0, VOCAB), info)
    assert out.next_token_ids.shape == (0,)


def reference_fmix32(value: int) -> int:
    """MurmurHash3's finalizer on Python ints (unbounded, so masked by hand)."""
    value ^= value >> 16
    value = (value * 0x85EBCA6B) & 0xFFFFFFFF
    value ^= value >> 13
    value = (value * 0xC2B2AE35) & 0xFFFFFFFF
    return value ^ (value >> 16)


def test_int32_hash_is_murmur_fmix32_bit_for_bit():
    """The noise hash relies on int32 products wrapping modulo 2**32 on this backend."""
    values = [0, 1, 2, 12345, 0x7FFFFFFF, 0x80000000, 0x9E3779B9, 0xFFFFFFFF]
    values += torch.randint(0, 2**32, (500,), generator=torch.Generator().manual_seed(0)).tolist()
    as_int32 = torch.tensor([v - 2**32 if v >= 2**31 else v for v in values], dtype=torch.int32)
    hashed = [h & 0xFFFFFFFF for h in fmix32(as_int32).tolist()]
    assert hashed == [reference_fmix32(v) for v in values]


def test_top_k_filter_is_the_same_whether_or_not_the_batch_sorts_for_top_p():
    """Top-k alone takes a cheap topk path, with top-p in the batch a sort path: a row's
    allowed set must not depend on which one its neighbours caused."""
    logits = torch.tensor([3.0, 2.0, 1.0, 1.0, 1.0, 0.0, -1.0, -2.0])  # ties at rank 3..5
    row = FakeReq(SamplingParams(top_k=3, seed=0))
    alone = batch([row], vocab=8)
    with_top_p = batch([row, FakeReq(SamplingParams(top_p=0.5, seed=1))], vocab=8)
    assert alone.need_top_k and not alone.need_top_p and with_top_p.need_top_p
    fast = allowed_tokens(logits[None, :].clone(), alone)
    sorted_path = allowed_tokens(logits.expand(2, -1).clone(), with_top_p)[:1]
    assert torch.equal(fast, sorted_path)
    assert fast[0].tolist() == [True] * 5 + [False] * 3  # ties at the boundary all stay
