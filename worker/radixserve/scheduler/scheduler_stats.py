"""The scheduler's statistics: monotonic counters for server info, and deltas since the last
report for Prometheus (`SchedulerStats`, applied by the front end).

Kept apart from the policy so that counting never shapes a scheduling decision and a new
metric is a change to this file alone.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from radixserve.metrics.stats import SchedulerStats
from radixserve.speculative.speculator import SpecCounters

# prefix cache hit rate gauge: over the prompts of the last this many admitted requests
HIT_RATE_WINDOW = 256


class SchedulerCounters:
    def __init__(self) -> None:
        # monotonic, for /get_server_info
        self.num_retractions = 0
        self.prefix_cache_query_tokens = 0
        self.prefix_cache_hit_tokens = 0
        self.computed_prefill_tokens = 0
        self.forward_steps_by_mode: dict[str, int] = {
            "prefill": 0,
            "decode": 0,
            "mixed": 0,
            "verify": 0,
        }
        # the last HIT_RATE_WINDOW lookups and their running sums (a report reads the rate
        # after every step that ran: no re-summing of the window each time)
        self._hit_window: deque[tuple[int, int]] = deque()
        self._window_queries = 0
        self._window_hits = 0
        # since the last report
        self._steps: list[tuple[str, int, int, float]] = []
        self._query_delta = 0
        self._hit_delta = 0
        self._retraction_delta = 0
        self._spec = SpecCounters()
        # prompt tokens restored from the lower KV tiers, so far and since the last report
        self.prefix_cache_hit_tokens_by_tier: dict[str, int] = {}
        self._tier_hit_delta: dict[str, int] = {}

    def count_prefix_lookup(
        self, query_tokens: int, hit_tokens: int, restored: dict[str, int] | None = None
    ) -> None:
        """A request's first admission: its prompt looked up in the prefix cache; `restored`:
        how many of the hits came back from each lower KV tier (host, disk)."""
        left = hit_tokens
        for tier, n in (restored or {}).items():
            n = min(n, left)  # a restore counted once, however often admission was tried
            left -= n
            self.prefix_cache_hit_tokens_by_tier[tier] = (
                self.prefix_cache_hit_tokens_by_tier.get(tier, 0) + n
            )
            self._tier_hit_delta[tier] = self._tier_hit_delta.get(tier, 0) + n
        self.prefix_cache_query_tokens += query_tokens
        self.prefix_cache_hit_tokens += hit_tokens
        self._query_delta += query_tokens
        self._hit_delta += hit_tokens
        self._hit_window.append((query_tokens, hit_tokens))
        self._window_queries += query_tokens
        self._window_hits += hit_tokens
        if len(self._hit_window) > HIT_RATE_WINDOW:
            old_queries, old_hits = self._hit_window.popleft()
            self._window_queries -= old_queries
            self._window_hits -= old_hits

    def count_retractions(self, n: int) -> None:
        self.num_retractions += n
        self._retraction_delta += n

    def count_prefill(self, computed_tokens: int) -> None:
        self.computed_prefill_tokens += computed_tokens

    def count_step(self, mode: str, batch_size: int, tokens: int, seconds: float) -> None:
        self.forward_steps_by_mode[mode] += 1
        self._steps.append((mode, batch_size, tokens, seconds))

    def count_speculation(self, counters: SpecCounters) -> None:
        """Verify-step outcomes (the speculator's, popped) for the next report."""
        self._spec = SpecCounters(
            self._spec.proposed_tokens + counters.proposed_tokens,
            self._spec.accepted_tokens + counters.accepted_tokens,
            self._spec.acceptance_lengths + counters.acceptance_lengths,
        )

    def hit_rate(self) -> float:
        queries = self._window_queries
        return self._window_hits / queries if queries else 0.0

    def pop(
        self,
        running: int,
        queued: int,
        kv_usage: float,
        kv_evictable: float,
        max_total_tokens: int,
    ) -> SchedulerStats:
        """The report since the last one, with the current gauges."""
        stats = SchedulerStats(
            num_running_requests=running,
            num_queued_requests=queued,
            kv_cache_usage_ratio=kv_usage,
            kv_cache_evictable_ratio=kv_evictable,
            prefix_cache_hit_rate=self.hit_rate(),
            max_total_tokens=max_total_tokens,
            prefix_cache_queries_tokens=self._query_delta,
            prefix_cache_hits_tokens=self._hit_delta,
            prefix_cache_hits_by_tier=self._tier_hit_delta,
            retractions=self._retraction_delta,
            steps=self._steps,
            spec_proposed_tokens=self._spec.proposed_tokens,
            spec_accepted_tokens=self._spec.accepted_tokens,
            spec_acceptance_lengths=self._spec.acceptance_lengths,
        )
        self._spec = SpecCounters()
        self._steps = []
        self._tier_hit_delta = {}
        self._query_delta = self._hit_delta = self._retraction_delta = 0
        return stats

    def info(self) -> dict[str, Any]:
        return {
            "num_retractions": self.num_retractions,
            "prefix_cache_query_tokens": self.prefix_cache_query_tokens,
            "prefix_cache_hit_tokens": self.prefix_cache_hit_tokens,
            "prefix_cache_hit_tokens_by_tier": dict(self.prefix_cache_hit_tokens_by_tier),
            "computed_prefill_tokens": self.computed_prefill_tokens,
            "forward_steps_by_mode": dict(self.forward_steps_by_mode),
        }
