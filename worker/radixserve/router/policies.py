"""Routing policies: which ready worker gets a request. A registry names them for the CLI.

Every policy sees the request's routing key (the prompt as text, see `routing.py`) and the
candidate workers with their load, and returns the chosen worker and the decision that chose
it (the `decision` label of `radixserve_router_requests_total`).

- `cache_aware` (SGLang's router): an approximate prefix tree per worker of what it was sent.
  When the load is balanced and some worker was sent at least `cache_threshold` of the prompt,
  the worker with the longest match gets it (`prefix`); a shorter match goes to the least
  loaded worker (`least_loaded`, ties to the worker with the smallest tree: the most room for
  a new prefix). The load is imbalanced when max - min > `balance_abs_threshold` and max >
  `balance_rel_threshold` x min; then the least loaded worker gets it whatever it matches
  (`balance`). Every choice is recorded in the tree. With an event index
  (`--prefix-source events`, `kv_index.py`) a request whose prompt tokens the router has is
  matched against what each worker's KV events say it holds, in whole blocks, instead of the
  tree (which still decides for requests without tokens and breaks load ties); a LoRA
  adapter's request is matched against that adapter's blocks (`lora_name`).
- `power_of_two`: the less loaded of two workers drawn at random.
- `round_robin`: each worker in turn.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from radixserve.router.kv_index import KVEventIndex
from radixserve.router.prefix_tree import ApproximatePrefixTree


class Candidate(Protocol):
    """What a policy reads of a worker."""

    @property
    def url(self) -> str: ...

    @property
    def load(self) -> float: ...


@dataclass(frozen=True)
class PolicyConfig:
    cache_threshold: float = 0.5
    balance_abs_threshold: float = 32
    balance_rel_threshold: float = 1.0001
    max_tree_chars: int = 4 * 1024 * 1024
    seed: int = 0


class Policy(Protocol):
    def choose(
        self,
        key: str,
        candidates: Sequence[Candidate],
        token_ids: Sequence[int] | None = None,
        lora_name: str | None = None,
    ) -> tuple[Candidate, str]:
        """The worker for a request with routing key `key` (and, where the policy asked for
        them, its prompt's token ids and the LoRA adapter they run under), and the decision's
        name."""
        ...

    def forget(self, url: str) -> None:
        """What the policy knows of a worker's cache is void: it left the pool or was flushed."""
        ...


class RoundRobinPolicy:
    def __init__(self, config: PolicyConfig) -> None:
        self._turn = 0

    def choose(
        self,
        key: str,
        candidates: Sequence[Candidate],
        token_ids: Sequence[int] | None = None,
        lora_name: str | None = None,
    ) -> tuple[Candidate, str]:
        ordered = sorted(candidates, key=lambda c: c.url)
        chosen = ordered[self._turn % len(ordered)]
        self._turn += 1
        return chosen, "round_robin"

    def forget(self, url: str) -> None:
        pass


class PowerOfTwoPolicy:
    def __init__(self, config: PolicyConfig) -> None:
        self._rng = random.Random(config.seed)

    def choose(
        self,
        key: str,
        candidates: Sequence[Candidate],
        token_ids: Sequence[int] | None = None,
        lora_name: str | None = None,
    ) -> tuple[Candidate, str]:
        if len(candidates) == 1:
            return candidates[0], "power_of_two"
        first, second = self._rng.sample(list(candidates), 2)
        return (second if second.load < first.load else first), "power_of_two"

    def forget(self, url: str) -> None:
        pass


class CacheAwarePolicy:
    def __init__(self, config: PolicyConfig, events: KVEventIndex | None = None) -> None:
        self.config = config
        self.tree = ApproximatePrefixTree(config.max_tree_chars)
        self.events = events

    def choose(
        self,
        key: str,
        candidates: Sequence[Candidate],
        token_ids: Sequence[int] | None = None,
        lora_name: str | None = None,
    ) -> tuple[Candidate, str]:
        chosen, decision = self._decide(key, candidates, token_ids, lora_name)
        if key:
            self.tree.insert(key, chosen.url)
        return chosen, decision

    def _matched(
        self,
        key: str,
        candidates: Sequence[Candidate],
        token_ids: Sequence[int] | None,
        lora_name: str | None,
    ) -> tuple[dict[str, int], int]:
        """Each worker's match and the prompt's length: tokens held (events) or characters
        sent (the tree)."""
        if self.events is not None and token_ids:
            urls = (c.url for c in candidates)
            return self.events.match(token_ids, urls, lora_name), len(token_ids)
        return (self.tree.match(key) if key else {}), len(key)

    def _decide(
        self,
        key: str,
        candidates: Sequence[Candidate],
        token_ids: Sequence[int] | None,
        lora_name: str | None,
    ) -> tuple[Candidate, str]:
        loads = [c.load for c in candidates]
        highest, lowest = max(loads), min(loads)
        if (
            highest - lowest > self.config.balance_abs_threshold
            and highest > lowest * self.config.balance_rel_threshold
        ):
            return self._least_loaded(candidates), "balance"
        matched, length = self._matched(key, candidates, token_ids, lora_name)
        best = max(candidates, key=lambda c: (matched.get(c.url, 0), -c.load))
        if length and matched.get(best.url, 0) / length > self.config.cache_threshold:
            return best, "prefix"
        return self._least_loaded(candidates), "least_loaded"

    def _least_loaded(self, candidates: Sequence[Candidate]) -> Candidate:
        return min(candidates, key=lambda c: (c.load, self.tree.size(c.url), c.url))

    def forget(self, url: str) -> None:
        self.tree.remove_tenant(url)


POLICIES: dict[str, Callable[[PolicyConfig], Policy]] = {
    "cache_aware": CacheAwarePolicy,
    "power_of_two": PowerOfTwoPolicy,
    "round_robin": RoundRobinPolicy,
}
DEFAULT_POLICY = "cache_aware"


def create_policy(name: str, config: PolicyConfig, events: KVEventIndex | None = None) -> Policy:
    """The policy `name`; `events` (the KV event index) serves cache_aware only."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})") from None
    if name == "cache_aware" and events is not None:
        return CacheAwarePolicy(config, events)
    return factory(config)
