"""Routing policies: round robin, power of two, and SGLang's cache-aware choice."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from radixserve.router.policies import POLICIES, PolicyConfig, create_policy

PROMPT_A = "You are a pirate. " * 20 + "Where is the gold?"
PROMPT_B = "You are a lawyer. " * 20 + "May I sue?"


@dataclass
class Worker:
    url: str
    load: float = 0.0


def workers(*loads: float) -> list[Worker]:
    return [Worker(f"http://w{i}:8000", load) for i, load in enumerate(loads)]


def test_the_registry_names_every_policy_and_refuses_unknown_ones() -> None:
    assert set(POLICIES) == {"cache_aware", "power_of_two", "round_robin"}
    with pytest.raises(ValueError, match="unknown policy 'random'.*cache_aware"):
        create_policy("random", PolicyConfig())


def test_round_robin_takes_workers_in_turn_whatever_their_order() -> None:
    policy = create_policy("round_robin", PolicyConfig())
    pool = workers(0, 0, 0)
    chosen = [policy.choose("", list(reversed(pool)))[0].url for _ in range(6)]
    assert chosen == [w.url for w in pool] * 2
    assert policy.choose("", pool)[1] == "round_robin"


def test_power_of_two_never_picks_the_more_loaded_of_two() -> None:
    policy = create_policy("power_of_two", PolicyConfig(seed=3))
    busy, idle = workers(9, 1)
    assert {policy.choose("", [busy, idle])[0].url for _ in range(20)} == {idle.url}
    pool = workers(5, 0, 5, 5)
    picks = [policy.choose("", pool)[0] for _ in range(200)]
    # The idle worker wins every draw it is in: half of them, for 2 of 4 workers.
    assert 70 < sum(p.load == 0 for p in picks) < 130
    assert all(p.load in (0, 5) for p in picks)


def test_cache_aware_sends_a_repeated_prefix_to_the_worker_that_has_it() -> None:
    policy = create_policy("cache_aware", PolicyConfig())
    pool = workers(0, 0, 0)
    first, decision = policy.choose(PROMPT_A, pool)
    assert decision == "least_loaded"
    first.load = 2  # busier than the others now, but within the balance thresholds
    follow_up, decision = policy.choose(PROMPT_A + " And the map?", pool)
    assert (follow_up, decision) == (first, "prefix")


def test_cache_aware_spreads_new_prompts_to_the_least_loaded_then_emptiest_worker() -> None:
    policy = create_policy("cache_aware", PolicyConfig())
    pool = workers(0, 0, 0)
    a, _ = policy.choose(PROMPT_A, pool)
    b, decision = policy.choose(PROMPT_B, pool)  # same loads: the smaller tree wins
    assert decision == "least_loaded" and b is not a
    pool[2].load = 0
    for worker in pool:
        worker.load = 1
    pool[1].load = 0
    c, _ = policy.choose("Something else entirely.", pool)
    assert c is pool[1]


def test_cache_aware_needs_the_match_to_cover_the_threshold() -> None:
    policy = create_policy("cache_aware", PolicyConfig(cache_threshold=0.5))
    pool = workers(0, 0)
    holder, _ = policy.choose("abcdefghij", pool)
    holder.load = 1
    other = next(w for w in pool if w is not holder)
    # 4 of 10 characters match: below the threshold, so the least loaded worker gets it.
    assert policy.choose("abcd012345", pool) == (other, "least_loaded")
    # 6 of 10 match: above it.
    assert policy.choose("abcdef0123", pool) == (holder, "prefix")


def test_cache_aware_balances_when_the_load_is_skewed() -> None:
    policy = create_policy(
        "cache_aware", PolicyConfig(balance_abs_threshold=4, balance_rel_threshold=2.0)
    )
    pool = workers(0, 0)
    holder, _ = policy.choose(PROMPT_A, pool)
    other = next(w for w in pool if w is not holder)
    holder.load, other.load = 5, 2  # spread 3: within the absolute threshold
    assert policy.choose(PROMPT_A, pool) == (holder, "prefix")
    holder.load, other.load = 9, 2  # spread 7 > 4 and 9 > 2 x 2: imbalanced
    assert policy.choose(PROMPT_A, pool) == (other, "balance")
    holder.load, other.load = 15, 10  # spread 5 > 4 but 15 < 2 x 10: balanced enough
    assert policy.choose(PROMPT_A, pool)[1] == "prefix"


def test_cache_aware_forgets_a_worker_that_left() -> None:
    policy = create_policy("cache_aware", PolicyConfig())
    pool = workers(0, 0)
    holder, _ = policy.choose(PROMPT_A, pool)
    holder.load = 1
    policy.forget(holder.url)
    assert policy.choose(PROMPT_A, pool)[1] == "least_loaded"


def test_cache_aware_with_an_empty_key_goes_by_load() -> None:
    policy = create_policy("cache_aware", PolicyConfig())
    pool = workers(3, 1, 2)
    assert policy.choose("", pool) == (pool[1], "least_loaded")
