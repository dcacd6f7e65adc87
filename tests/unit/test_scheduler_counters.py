"""The prefix-cache hit-rate gauge: over the last HIT_RATE_WINDOW lookups, kept as running sums."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from radixserve.scheduler.scheduler_stats import HIT_RATE_WINDOW, SchedulerCounters

lookups = st.lists(
    st.integers(0, 500).flatmap(lambda q: st.tuples(st.just(q), st.integers(0, q))),
    max_size=3 * HIT_RATE_WINDOW,
)


@given(lookups)
def test_the_hit_rate_is_that_of_the_last_window_of_lookups(seen):
    counters = SchedulerCounters()
    for queries, hits in seen:
        counters.count_prefix_lookup(queries, hits)
    window = seen[-HIT_RATE_WINDOW:]
    total = sum(q for q, _ in window)
    expected = sum(h for _, h in window) / total if total else 0.0
    assert abs(counters.hit_rate() - expected) < 1e-12
    # the monotonic counters keep everything
    assert counters.prefix_cache_query_tokens == sum(q for q, _ in seen)
