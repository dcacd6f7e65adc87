"""The upstream workers: who they are, whether they take requests, how loaded they are.

Membership comes from discovery (a fixed list, or EndpointSlices). A worker's state is
`ready` (gets requests), `not_ready` (its `/ready` answers 503: loading or draining; it gets no
new requests) or `down` (unreachable: a connect error, from a probe or from a request). A
prober checks every worker's `/ready` each interval and reads its queue gauges from `/metrics`.

Load is what the router has in flight at the worker, corrected by what the worker reports:
`in_flight + max(0, reported - in_flight_when_reported)`. The router's own count is exact and
immediate; the gauges (running + queued requests) add what the router did not send, such as
the requests of other router replicas.

With no ready worker, requests wait (`wait_for_ready`) in a bounded queue; the count of waiters
is `radixserve_router_pending_requests`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from radixserve.router.lora_affinity import AdapterAffinity, adapters_in_metrics
from radixserve.router.metrics import RouterMetrics

logger = logging.getLogger(__name__)

READY, NOT_READY, DOWN = "ready", "not_ready", "down"
LOAD_GAUGES = ("radixserve_num_running_requests", "radixserve_num_queued_requests")
PROBE_TIMEOUT_S = 5.0


class NoReadyWorkerError(Exception):
    """No worker became ready before the deadline."""


class PendingQueueFullError(Exception):
    """Too many requests already wait for a worker."""


class Upstream:
    """One worker as the router sees it."""

    def __init__(self, url: str, state: str = NOT_READY) -> None:
        self.url = url
        self.state = state
        self.in_flight = 0
        self.reported = 0.0  # running + queued requests at the last scrape
        self.in_flight_when_reported = 0
        self.last_problem = ""
        # the LoRA adapters its radixserve_lora_requests_info lists (running and waiting)
        self.lora_adapters: frozenset[str] = frozenset()

    @property
    def load(self) -> float:
        return self.in_flight + max(0.0, self.reported - self.in_flight_when_reported)

    def describe(self) -> dict[str, object]:
        return {
            "url": self.url,
            "state": self.state,
            "in_flight": self.in_flight,
            "load": self.load,
            "problem": self.last_problem,
        }


class UpstreamPool:
    def __init__(
        self,
        metrics: RouterMetrics,
        *,
        max_pending: int,
        on_removed: Callable[[str], None] = lambda url: None,
        lora: AdapterAffinity | None = None,
    ) -> None:
        self.metrics = metrics
        self.max_pending = max_pending
        self._on_removed = on_removed
        self.lora = lora  # learns from the probes which worker has which LoRA adapter
        self._members: dict[str, Upstream] = {}
        self._any_ready = asyncio.Event()
        self._pending = 0

    # -- membership and state

    def members(self) -> list[Upstream]:
        return list(self._members.values())

    def ready(self) -> list[Upstream]:
        return [u for u in self._members.values() if u.state == READY]

    def get(self, url: str) -> Upstream | None:
        return self._members.get(url)

    def set_members(self, urls: Iterable[str], *, state: str = NOT_READY) -> None:
        """Discovery's view: add the new workers (in `state`), drop the ones that left."""
        wanted = set(urls)
        for url in list(self._members):
            if url not in wanted:
                del self._members[url]
                self._on_removed(url)
                logger.info("worker %s left the pool", url)
        for url in sorted(wanted - set(self._members)):
            self._members[url] = Upstream(url, state)
            logger.info("worker %s joined the pool (%s)", url, state)
        self._publish()

    def set_state(self, upstream: Upstream, state: str, problem: str = "") -> None:
        if upstream.state != state:
            logger.info("worker %s: %s -> %s %s", upstream.url, upstream.state, state, problem)
        upstream.state = state
        upstream.last_problem = problem
        if state != READY:
            upstream.reported = upstream.in_flight_when_reported = 0
        self._publish()

    def _publish(self) -> None:
        counts = {READY: 0, NOT_READY: 0, DOWN: 0}
        for upstream in self._members.values():
            counts[upstream.state] += 1
        self.metrics.set_worker_counts(counts)
        if counts[READY]:
            self._any_ready.set()
        else:
            self._any_ready.clear()

    # -- the pending queue

    @property
    def pending(self) -> int:
        return self._pending

    async def wait_for_ready(self, deadline: float) -> None:
        """Return once some worker is ready; raise when the queue is full or at `deadline`."""
        if self._any_ready.is_set():
            return
        if self._pending >= self.max_pending:
            raise PendingQueueFullError
        self._pending += 1
        self.metrics.pending_requests.set(self._pending)
        try:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoReadyWorkerError
            try:
                await asyncio.wait_for(self._any_ready.wait(), remaining)
            except TimeoutError:
                raise NoReadyWorkerError from None
        finally:
            self._pending -= 1
            self.metrics.pending_requests.set(self._pending)

    # -- probing

    async def probe_all(self, session: aiohttp.ClientSession) -> None:
        members = self.members()
        await asyncio.gather(*(self.probe(session, upstream) for upstream in members))

    async def probe(self, session: aiohttp.ClientSession, upstream: Upstream) -> None:
        """`/ready` decides the state; a ready worker's `/metrics` gives its queue gauges."""
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
        try:
            async with session.get(upstream.url + "/ready", timeout=timeout) as reply:
                reason = "" if reply.status == 200 else (await reply.text())[:200]
                ready = reply.status == 200
            if ready:
                async with session.get(upstream.url + "/metrics", timeout=timeout) as reply:
                    text = await reply.text() if reply.status == 200 else ""
        except (TimeoutError, aiohttp.ClientError) as exc:
            if upstream.url in self._members:
                self.set_state(upstream, DOWN, f"probe: {exc!r}")
            return
        if upstream.url not in self._members:
            return  # it left the pool while we probed
        if not ready:
            self.set_state(upstream, NOT_READY, f"/ready: {reason}")
            return
        self.set_state(upstream, READY)
        if text:
            upstream.reported = queue_gauges(text)
            upstream.in_flight_when_reported = upstream.in_flight
            if self.lora is not None:
                await self._learn_adapters(session, upstream, text)

    async def _learn_adapters(
        self, session: aiohttp.ClientSession, upstream: Upstream, metrics: str
    ) -> None:
        """A worker that serves LoRA adapters: which it has (its gauge) and which names are
        adapters (its /v1/models; a worker behind API keys answers 401 and the gauge alone
        counts)."""
        assert self.lora is not None
        adapters = adapters_in_metrics(metrics)
        if adapters is None:
            return
        upstream.lora_adapters = adapters
        self.lora.active = True
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
        with contextlib.suppress(TimeoutError, aiohttp.ClientError, ValueError):
            async with session.get(upstream.url + "/v1/models", timeout=timeout) as reply:
                if reply.status == 200:
                    self.lora.learn_models(await reply.json())

    async def run_prober(self, session: aiohttp.ClientSession, interval: float) -> None:
        while True:
            try:
                await self.probe_all(session)
            except Exception:  # a bug here must not stop probing: log it and go on
                logger.exception("probing the workers failed")
            await asyncio.sleep(interval)


def queue_gauges(exposition: str) -> float:
    """Running plus queued requests, summed over the series of a worker's `/metrics`."""
    total = 0.0
    for family in text_string_to_metric_families(exposition):
        if family.name in LOAD_GAUGES:
            total += sum(sample.value for sample in family.samples)
    return total
