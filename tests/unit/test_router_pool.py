"""The upstream pool: load, membership, states and the bounded wait for a ready worker."""

from __future__ import annotations

import asyncio
import time

import pytest

from radixserve.router.metrics import RouterMetrics
from radixserve.router.pool import (
    DOWN,
    NOT_READY,
    READY,
    NoReadyWorkerError,
    PendingQueueFullError,
    Upstream,
    UpstreamPool,
    queue_gauges,
)

EXPOSITION = """\
# HELP radixserve_num_running_requests Requests in the running batch
# TYPE radixserve_num_running_requests gauge
radixserve_num_running_requests{model_name="m"} 3.0
# HELP radixserve_num_queued_requests Requests waiting for admission
# TYPE radixserve_num_queued_requests gauge
radixserve_num_queued_requests{model_name="m"} 2.0
# HELP radixserve_kv_cache_usage_ratio Used KV slots / total slots
# TYPE radixserve_kv_cache_usage_ratio gauge
radixserve_kv_cache_usage_ratio{model_name="m"} 0.5
"""


def sample(metrics: RouterMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, {"model_name": "m", **labels})
    return 0.0 if value is None else value


def test_queue_gauges_sum_running_and_queued() -> None:
    assert queue_gauges(EXPOSITION) == 5.0


def test_load_is_in_flight_plus_what_others_sent() -> None:
    upstream = Upstream("http://w:1")
    upstream.in_flight = 2
    upstream.reported, upstream.in_flight_when_reported = 5, 2  # 3 requests from elsewhere
    assert upstream.load == 5
    upstream.in_flight = 4  # two more of ours since the scrape
    assert upstream.load == 7
    upstream.reported = 1  # the worker finished ours faster than it reported: never negative
    assert upstream.load == 4


def test_membership_and_states_drive_the_worker_gauge_and_removal_callback() -> None:
    removed: list[str] = []
    metrics = RouterMetrics("m")
    pool = UpstreamPool(metrics, max_pending=4, on_removed=removed.append)
    pool.set_members(["http://a:1", "http://b:1"], state=READY)
    assert [u.url for u in pool.ready()] == ["http://a:1", "http://b:1"]
    pool.set_state(pool.get("http://a:1"), DOWN, "refused")
    assert sample(metrics, "radixserve_router_workers", state="ready") == 1
    assert sample(metrics, "radixserve_router_workers", state="down") == 1
    pool.set_members(["http://b:1", "http://c:1"])  # a leaves, c joins not ready
    assert removed == ["http://a:1"]
    assert pool.get("http://c:1").state == NOT_READY
    assert pool.get("http://b:1").state == READY  # members that stay keep their state
    assert sample(metrics, "radixserve_router_workers", state="not_ready") == 1


def test_requests_wait_for_a_ready_worker_and_count_as_pending() -> None:
    async def scenario() -> tuple[list[float], float]:
        metrics = RouterMetrics("m")
        pool = UpstreamPool(metrics, max_pending=8)
        pool.set_members(["http://a:1"])
        waiters = [
            asyncio.create_task(pool.wait_for_ready(time.monotonic() + 10)) for _ in range(3)
        ]
        await asyncio.sleep(0.05)
        seen = [sample(metrics, "radixserve_router_pending_requests")]
        pool.set_state(pool.get("http://a:1"), READY)
        await asyncio.gather(*waiters)
        seen.append(sample(metrics, "radixserve_router_pending_requests"))
        return seen, pool.pending

    pending_seen, left = asyncio.run(scenario())
    assert pending_seen == [3, 0] and left == 0


def test_the_wait_is_bounded_in_time_and_in_size() -> None:
    async def scenario() -> None:
        pool = UpstreamPool(RouterMetrics("m"), max_pending=1)
        first = asyncio.create_task(pool.wait_for_ready(time.monotonic() + 0.2))
        await asyncio.sleep(0.01)
        with pytest.raises(PendingQueueFullError):
            await pool.wait_for_ready(time.monotonic() + 10)
        with pytest.raises(NoReadyWorkerError):
            await first
        assert pool.pending == 0

    asyncio.run(scenario())
