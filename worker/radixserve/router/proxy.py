"""Forwarding one request: pick a worker, retry what failed before its first byte, relay the rest.

An attempt fails *before its first byte* when the worker cannot be reached or the connection
drops before a response (the worker is then taken out: `down`), or when it answers 429 (queue
full) or 503 (draining: the worker is taken out as `not_ready`). Such a request goes to another
worker, at most `max_retries` times; when no other ready worker is left the last worker answer
is the client's, unchanged. Any other answer is the worker's to give: errors pass through as they are.

Non-streaming answers are read whole before the first byte goes to the client, so a worker
dying mid-generation is still a retry. Server-sent events are relayed event by event as they
arrive (reading the worker no faster than the client reads the router: backpressure); a stream
that breaks midway ends with an OpenAI-shaped error event and `data: [DONE]`, never silently.
A client that goes away cancels its handler (aiohttp's handler cancellation), and closing the
upstream response closes its connection: the worker sees the disconnect and aborts the request.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from radixserve.api_errors import RETRY_AFTER_S, APIError, error_body, error_response
from radixserve.router.metrics import RouterMetrics
from radixserve.router.policies import Policy
from radixserve.router.pool import (
    DOWN,
    NOT_READY,
    NoReadyWorkerError,
    PendingQueueFullError,
    Upstream,
    UpstreamPool,
)
from radixserve.router.routing import routing_key

logger = logging.getLogger(__name__)

RETRYABLE_STATUSES = (429, 503)
WORKER_HEADER = "X-Radixserve-Worker"
# Hop-by-hop headers (RFC 9110 7.6.1) and the ones aiohttp computes itself.
_NOT_FORWARDED = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE",
        "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
    )
)  # fmt: skip
_SSE_END = b"\n\n"
_DONE = b"data: [DONE]"


def forwarded_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in _NOT_FORWARDED)


@dataclass
class Refusal:
    """A worker's answer (or silence) that another worker may do better than."""

    status: int = 0  # 0: no answer at all
    headers: CIMultiDict[str] | None = None
    body: bytes = b""
    problem: str = ""

    def response(self) -> web.Response:
        if self.status:
            return web.Response(status=self.status, headers=self.headers, body=self.body)
        return error_response(
            APIError(
                f"no worker could take the request: {self.problem}",
                503,
                type="server_error",
                code="upstream_unavailable",
                retry_after=RETRY_AFTER_S,
            )
        )


class Proxy:
    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        pool: UpstreamPool,
        policy: Policy,
        metrics: RouterMetrics,
        max_retries: int,
        pending_timeout: float,
    ) -> None:
        self.session = session
        self.pool = pool
        self.policy = policy
        self.metrics = metrics
        self.max_retries = max_retries
        self.pending_timeout = pending_timeout

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        try:
            return await self._forward(request, started)
        finally:
            self.metrics.request_latency.observe(time.monotonic() - started)

    async def _forward(self, request: web.Request, started: float) -> web.StreamResponse:
        body = await request.read()
        key = routing_key(request.path, body)
        deadline = started + self.pending_timeout
        tried: set[str] = set()
        refusal = Refusal(problem="no attempt made")
        for attempt in range(self.max_retries + 1):
            try:
                picked = await self._pick(key, tried, deadline)
            except NoReadyWorkerError:
                return error_response(
                    APIError(
                        f"no ready worker within {self.pending_timeout:g}s",
                        503,
                        type="server_error",
                        code="no_ready_worker",
                        retry_after=RETRY_AFTER_S,
                    )
                )
            except PendingQueueFullError:
                return error_response(
                    APIError(
                        f"{self.pool.max_pending} requests already wait for a worker",
                        503,
                        type="server_error",
                        code="pending_queue_full",
                        retry_after=RETRY_AFTER_S,
                    )
                )
            if picked is None:
                break  # every ready worker refused this request already
            upstream, decision = picked
            if attempt:
                self.metrics.retries.inc()
            tried.add(upstream.url)
            self.metrics.routed(upstream.url, decision)
            upstream.in_flight += 1
            try:
                outcome = await self._attempt(request, upstream, body)
            finally:
                upstream.in_flight -= 1
            if not isinstance(outcome, Refusal):
                return outcome
            if outcome.status or not refusal.status:  # a worker's own answer beats silence
                refusal = outcome
        return refusal.response()

    async def _pick(
        self, key: str, tried: set[str], deadline: float
    ) -> tuple[Upstream, str] | None:
        while True:
            ready = self.pool.ready()
            if not ready:
                await self.pool.wait_for_ready(deadline)
                tried.clear()  # a worker back from down may take the request again
                continue
            candidates = [u for u in ready if u.url not in tried]
            if not candidates:
                return None
            chosen, decision = self.policy.choose(key, candidates)
            return cast(Upstream, chosen), decision

    async def _attempt(
        self, request: web.Request, upstream: Upstream, body: bytes
    ) -> web.StreamResponse | Refusal:
        try:
            reply = await self.session.request(
                request.method,
                upstream.url + request.path_qs,
                data=body if request.method == "POST" else None,
                headers=forwarded_headers(request.headers),
            )
        except aiohttp.ClientConnectionError as exc:
            self.metrics.upstream_error(upstream.url, "connect")
            self.pool.set_state(upstream, DOWN, f"request: {exc!r}")
            return Refusal(problem=f"{upstream.url}: {exc!r}")
        try:
            if reply.content_type == "text/event-stream" and reply.status == 200:
                return await self._relay_events(request, reply, upstream)
            payload = await reply.read()
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            # dropped before the whole answer came: nothing reached the client yet
            self.metrics.upstream_error(upstream.url, "connect")
            self.pool.set_state(upstream, DOWN, f"request: {exc!r}")
            return Refusal(problem=f"{upstream.url}: {exc!r}")
        finally:
            reply.close()  # after a complete read this is a no-op; otherwise it aborts
        headers = forwarded_headers(reply.headers)
        headers[WORKER_HEADER] = upstream.url
        if reply.status in RETRYABLE_STATUSES:
            self.metrics.upstream_error(upstream.url, f"status_{reply.status}")
            if reply.status == 503:
                self.pool.set_state(upstream, NOT_READY, "answered 503")
            return Refusal(reply.status, headers, payload, f"{upstream.url}: {reply.status}")
        return web.Response(status=reply.status, headers=headers, body=payload)

    async def _relay_events(
        self, request: web.Request, reply: aiohttp.ClientResponse, upstream: Upstream
    ) -> web.StreamResponse:
        headers = forwarded_headers(reply.headers)
        headers[WORKER_HEADER] = upstream.url
        out = web.StreamResponse(status=reply.status, headers=headers)
        await out.prepare(request)
        pending, finished = b"", False
        try:
            async for chunk in reply.content.iter_any():
                pending += chunk
                complete, sep, pending = pending.rpartition(_SSE_END)
                if sep:
                    finished = finished or any(
                        event.strip() == _DONE for event in complete.split(_SSE_END)
                    )
                    await out.write(complete + sep)
            if not finished:
                raise aiohttp.ClientPayloadError("the stream ended without data: [DONE]")
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.metrics.upstream_error(upstream.url, "stream_broken")
            logger.warning("stream from %s broke: %r", upstream.url, exc)
            event = error_body(
                f"the worker {upstream.url} stopped mid-stream: {exc}",
                type="server_error",
                code="upstream_disconnected",
            )
            await out.write(b"data: " + json.dumps(event).encode() + _SSE_END + _DONE + _SSE_END)
        await out.write_eof()
        return out
