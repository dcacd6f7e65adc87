"""Forwarding one request: pick a worker, retry what no worker started, relay the rest.

Only an attempt that the worker certainly never started is tried on another worker (at most
`max_retries` times): a connect error (nothing was sent; the worker is taken out as `down`),
429 (its queue is full), and a 503 whose error code says the worker turned the request away
before starting it (`draining`, `queue_full`, `no_ready_worker`, `pending_queue_full`,
`upstream_unavailable`; the worker is taken out as `not_ready`). When no other ready worker is
left the last worker answer is the client's, unchanged.

Everything else is final. An answer the worker gave passes through as it is, errors included.
A failure that may have happened *with the request inside the worker* is never spread: another
503 (the worker's scheduler is gone: `unavailable`), or a connection that broke after the
request was sent (the client gets 502 `upstream_failed`), or a stream that broke midway. One
curl that kills a worker must not kill the next one: such a request is answered, not retried,
and its fingerprint is struck in the `Quarantine` (two strikes: identical requests get 400
`request_quarantined` without reaching a worker). Only POSTs (the generation requests, whose
body can poison a worker) are fingerprinted: `GET /v1/models` is never quarantined.

Non-streaming answers are read whole before the first byte goes to the client. Server-sent
events are relayed event by event as they arrive (reading the worker no faster than the client
reads the router: backpressure), unchanged, whichever API's shape they have; a stream that
breaks midway ends with the error event its API's clients understand (`apis.StreamShape`:
OpenAI's with `data: [DONE]`, Anthropic's `event: error`, the Responses API's `error`), never
silently. A client that goes away cancels its handler (aiohttp's handler cancellation), and
closing the upstream response closes its connection: the worker sees the disconnect and aborts
the request.

A worker's error code is read from its `X-Radixserve-Error-Code` header (every worker error
reply carries it; Anthropic's body shape has no code), else from an OpenAI-shaped body.
Responses API requests naming a stored response go to the worker that made it
(`affinity.py`); the worker's answers teach the router which worker holds which response. One
naming a response the router does not know (made through another router replica, or before
this router started) is routed as usual, and a worker's 404 `not_found` sends it on to another
worker (within `max_retries`): the first that holds it answers, and is remembered.
Worker answers pass through marked `FROM_WORKER`: the router's own errors on `/v1/messages*`
are rewritten in Anthropic's shape (`server.api_error_shapes`), the worker's never.
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

from radixserve.api_errors import ERROR_CODE_HEADER, RETRY_AFTER_S, APIError, error_response
from radixserve.logging_config import escape_control
from radixserve.router.affinity import (
    ResponseAffinity,
    ResponseRequest,
    not_held,
    response_request,
)
from radixserve.router.apis import stream_shape
from radixserve.router.lora_affinity import AdapterAffinity, requested_model
from radixserve.router.metrics import RouterMetrics
from radixserve.router.policies import Policy
from radixserve.router.pool import (
    DOWN,
    NOT_READY,
    READY,
    NoReadyWorkerError,
    PendingQueueFullError,
    Upstream,
    UpstreamPool,
)
from radixserve.router.quarantine import Quarantine, fingerprint
from radixserve.router.routing import BodyTooDeepError, routing_key
from radixserve.router.tokens import prompt_token_ids

logger = logging.getLogger(__name__)

# 503 codes that say the worker never started the request (the worker's and a router's own)
NEVER_STARTED_503_CODES = frozenset(
    {"draining", "queue_full", "no_ready_worker", "pending_queue_full", "upstream_unavailable"}
)
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
# marks a response that is a worker's answer (passed through as it is, never reshaped)
FROM_WORKER = web.ResponseKey("radixserve_from_worker", bool)


def from_worker(response: web.StreamResponse) -> web.StreamResponse:
    response[FROM_WORKER] = True
    return response


def forwarded_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in _NOT_FORWARDED)


def error_code(payload: bytes, headers: Mapping[str, str] | None = None) -> str | None:
    """A worker's error code: its ERROR_CODE_HEADER (every error reply of a worker carries it,
    whatever API shape the body has), else the `error.code` of an OpenAI-shaped body."""
    if headers is not None and (code := headers.get(ERROR_CODE_HEADER)):
        return code
    try:
        error = json.loads(payload).get("error")
        code = error.get("code") if isinstance(error, dict) else None
    except (ValueError, UnicodeDecodeError, AttributeError, RecursionError):
        return None
    return code if isinstance(code, str) else None


def _not_found(response: web.StreamResponse) -> bool:
    """Whether a worker's whole answer is its 404 `not_found` (a response it does not hold)."""
    return (
        response.status == 404
        and isinstance(response, web.Response)
        and isinstance(response.body, bytes)
        and error_code(response.body) == "not_found"
    )


def never_started(status: int, payload: bytes, headers: Mapping[str, str] | None = None) -> bool:
    """Whether a worker's answer says it turned the request away before starting it."""
    code = error_code(payload, headers)
    return status == 429 or (status == 503 and code in NEVER_STARTED_503_CODES)


@dataclass
class Refusal:
    """A worker's answer (or silence) for a request it never started: another may take it."""

    status: int = 0  # 0: no answer at all
    headers: CIMultiDict[str] | None = None
    body: bytes = b""
    problem: str = ""

    def response(self) -> web.Response:
        if self.status:
            reply = web.Response(status=self.status, headers=self.headers, body=self.body)
            return cast(web.Response, from_worker(reply))
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
        quarantine: Quarantine | None = None,
        affinity: ResponseAffinity | None = None,
        tokenize: bool = False,
        lora: AdapterAffinity | None = None,
    ) -> None:
        self.session = session
        self.tokenize = tokenize  # --prefix-source events: the policy matches token ids
        self.pool = pool
        self.policy = policy
        self.metrics = metrics
        self.max_retries = max_retries
        self.pending_timeout = pending_timeout
        self.quarantine = quarantine if quarantine is not None else Quarantine(ttl=0)
        self.affinity = affinity if affinity is not None else ResponseAffinity()
        self.lora = lora

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        try:
            return await self._forward(request, started)
        finally:
            self.metrics.request_latency.observe(time.monotonic() - started)

    async def _forward(self, request: web.Request, started: float) -> web.StreamResponse:
        body = await request.read()
        print_ = fingerprint(request.method, request.path_qs, body)
        if request.method == "POST" and self.quarantine.is_quarantined(print_):
            self.metrics.quarantined.inc()
            return error_response(
                APIError(
                    "this request coincided with two worker failures and is quarantined:"
                    f" no worker gets it for up to {self.quarantine.ttl:g}s",
                    400,
                    code="request_quarantined",
                )
            )
        try:
            key = routing_key(request.path, body)
        except BodyTooDeepError as exc:
            return error_response(APIError(str(exc), 400, code="json_too_deep"))
        responses = response_request(request.method, request.path, body)
        if responses is not None and responses.named is not None:
            holder = self.affinity.holder(responses.named)
            if holder is not None:
                return await self._forward_to_holder(request, body, print_, responses, holder)
        deadline = started + self.pending_timeout
        tried: set[str] = set()
        refusal = Refusal(problem="no attempt made")
        refused = False
        miss: web.StreamResponse | None = None  # a worker's 404 for the response named
        for attempt in range(self.max_retries + 1):
            try:
                picked = await self._pick(key, tried, deadline, request, body)
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
                outcome = await self._attempt(request, upstream, body, print_, responses)
            finally:
                upstream.in_flight -= 1
            if not isinstance(outcome, Refusal):
                if responses is None or responses.named is None or not _not_found(outcome):
                    return outcome
                miss = outcome  # made on another worker, maybe (another router's, or forgotten)
                continue
            refused = True
            if outcome.status or not refusal.status:  # a worker's own answer beats silence
                refusal = outcome
        if miss is not None and not refused:
            return miss  # no worker asked holds it
        return refusal.response()

    async def _forward_to_holder(
        self,
        request: web.Request,
        body: bytes,
        print_: str,
        responses: ResponseRequest,
        url: str,
    ) -> web.StreamResponse:
        """A request naming a stored response goes to the worker that made it, or nowhere: no
        other worker holds it, so none is tried instead."""
        assert responses.named is not None
        upstream = self.pool.get(url)
        if upstream is None or upstream.state != READY:
            state = "gone from the pool" if upstream is None else upstream.state
            why = f"it was made on the worker {url}, which is {state}"
            return error_response(not_held(responses.named, responses.param, why))
        self.metrics.routed(upstream.url, "affinity")
        upstream.in_flight += 1
        try:
            outcome = await self._attempt(request, upstream, body, print_, responses)
        finally:
            upstream.in_flight -= 1
        if not isinstance(outcome, Refusal):
            return outcome
        if outcome.status:
            return outcome.response()  # its own refusal (429, draining): the client may retry
        why = f"it was made on the worker {url}, which is unreachable"
        return error_response(not_held(responses.named, responses.param, why))

    def _learn(
        self, responses: ResponseRequest | None, url: str, status: int, payload: bytes
    ) -> None:
        """What a worker's whole answer to a Responses API request says about who holds what."""
        if responses is None or status != 200:
            return
        if responses.deletes:
            assert responses.named is not None
            self.affinity.forget(responses.named)
            return
        if responses.named is not None:
            self.affinity.remember(responses.named, url)  # it answered from that response
        if responses.creates:
            try:
                response_id = json.loads(payload).get("id")
            except (ValueError, UnicodeDecodeError, AttributeError, RecursionError):
                return
            if isinstance(response_id, str):
                self.affinity.remember(response_id, url)

    async def _pick(
        self, key: str, tried: set[str], deadline: float, request: web.Request, body: bytes
    ) -> tuple[Upstream, str] | None:
        token_ids: list[int] | None = None
        while True:
            ready = self.pool.ready()
            if not ready:
                await self.pool.wait_for_ready(deadline)
                tried.clear()  # a worker back from down may take the request again
                continue
            candidates = [u for u in ready if u.url not in tried]
            if not candidates:
                return None
            adapter = self._adapter_of(body)
            if self.tokenize and token_ids is None and self._hashable(adapter):
                token_ids = await self._token_ids(request, body, candidates)
            if adapter is not None:
                assert self.lora is not None
                candidates, _ = self.lora.prefer(adapter, candidates)
            chosen, decision = self.policy.choose(key, candidates, token_ids, adapter)
            if adapter is not None:
                self.lora.placed(adapter, chosen.url)
            return cast(Upstream, chosen), decision

    def _adapter_of(self, body: bytes) -> str | None:
        """The LoRA adapter the request names, where some worker serves adapters."""
        if self.lora is None or not self.lora.active:
            return None
        model = requested_model(body)
        return model if self.lora.is_adapter(model) else None

    def _hashable(self, adapter: str | None) -> bool:
        """Whether the router knows how the workers hash this request's blocks: as the base
        model's, or as an adapter's that the workers list (its name is every block's extra key).
        A `model` that is neither (the base model's names unread behind API keys, an adapter not
        listed yet) is matched on the tree rather than risk matching another model's blocks."""
        return adapter is None or (self.lora is not None and adapter in self.lora.known)

    async def _token_ids(
        self, request: web.Request, body: bytes, candidates: list[Upstream]
    ) -> list[int] | None:
        """The prompt's token ids, tokenized by the least loaded candidate (its keys too)."""
        worker = min(candidates, key=lambda u: (u.load, u.url))
        keys = {
            h: request.headers[h] for h in ("Authorization", "x-api-key") if h in request.headers
        }
        return await prompt_token_ids(self.session, worker.url, request.path, body, keys)

    def _died_with(self, request: web.Request, print_: str, upstream: Upstream, how: str) -> None:
        """A worker failed with this request possibly inside it: strike its fingerprint."""
        logger.warning(
            "worker %s failed with request %s %s inside (%s): not retried",
            upstream.url,
            request.method,
            escape_control(request.path_qs),
            escape_control(how),
        )
        if request.method == "POST" and self.quarantine.strike(print_):
            logger.warning(
                "request %s %s (fingerprint %s) coincided with two worker failures, the last at"
                " %s: identical requests are refused for %gs",
                request.method,
                escape_control(request.path_qs),
                print_[:16],
                upstream.url,
                self.quarantine.ttl,
            )

    async def _attempt(
        self,
        request: web.Request,
        upstream: Upstream,
        body: bytes,
        print_: str,
        responses: ResponseRequest | None = None,
    ) -> web.StreamResponse | Refusal:
        try:
            reply = await self.session.request(
                request.method,
                upstream.url + request.path_qs,
                data=body if request.method == "POST" else None,
                headers=forwarded_headers(request.headers),
            )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            # no connection: the request was never sent
            self.metrics.upstream_error(upstream.url, "connect")
            self.pool.set_state(upstream, DOWN, f"request: {exc!r}")
            return Refusal(problem=f"{upstream.url}: {exc!r}")
        except aiohttp.ClientConnectionError as exc:
            # connected and sent (some of) it, then the connection broke: maybe it killed the worker
            return self._broken(request, upstream, print_, exc)
        try:
            if reply.content_type == "text/event-stream" and reply.status == 200:
                return await self._relay_events(request, reply, upstream, print_, responses)
            payload = await reply.read()
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            # dropped before the whole answer came: nothing reached the client yet
            return self._broken(request, upstream, print_, exc)
        finally:
            reply.close()  # after a complete read this is a no-op; otherwise it aborts
        headers = forwarded_headers(reply.headers)
        headers[WORKER_HEADER] = upstream.url
        if reply.status in (429, 503):
            self.metrics.upstream_error(upstream.url, f"status_{reply.status}")
            if reply.status == 503:
                self.pool.set_state(upstream, NOT_READY, "answered 503")
            if never_started(reply.status, payload, reply.headers):
                return Refusal(reply.status, headers, payload, f"{upstream.url}: {reply.status}")
            self._died_with(request, print_, upstream, f"503 {error_code(payload, reply.headers)}")
            if not payload:
                return self._failed(upstream, "it answered 503 without a body")
        self._learn(responses, upstream.url, reply.status, payload)
        return from_worker(web.Response(status=reply.status, headers=headers, body=payload))

    def _broken(
        self, request: web.Request, upstream: Upstream, print_: str, exc: Exception
    ) -> web.Response:
        self.metrics.upstream_error(upstream.url, "disconnected")
        self.pool.set_state(upstream, DOWN, f"request: {exc!r}")
        self._died_with(request, print_, upstream, repr(exc))
        return self._failed(upstream, repr(exc))

    @staticmethod
    def _failed(upstream: Upstream, why: str) -> web.Response:
        response = error_response(
            APIError(
                f"the worker {upstream.url} failed while handling the request ({why});"
                " it is not retried elsewhere",
                502,
                type="server_error",
                code="upstream_failed",
            )
        )
        response.headers[WORKER_HEADER] = upstream.url
        return response

    async def _relay_events(
        self,
        request: web.Request,
        reply: aiohttp.ClientResponse,
        upstream: Upstream,
        print_: str,
        responses: ResponseRequest | None = None,
    ) -> web.StreamResponse:
        headers = forwarded_headers(reply.headers)
        headers[WORKER_HEADER] = upstream.url
        out = from_worker(web.StreamResponse(status=reply.status, headers=headers))
        await out.prepare(request)
        shape = stream_shape(request.path)
        pending, learnt = b"", responses is None or not responses.creates
        try:
            async for chunk in reply.content.iter_any():
                pending += chunk
                complete, sep, pending = pending.rpartition(_SSE_END)
                if sep:
                    for event in complete.split(_SSE_END):
                        shape.feed(event)
                    if not learnt and shape.response_id is not None:
                        self.affinity.remember(shape.response_id, upstream.url)
                        learnt = True
                    await out.write(complete + sep)
            if not shape.ended:
                raise aiohttp.ClientPayloadError(f"the stream ended without {shape.last_event}")
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.metrics.upstream_error(upstream.url, "stream_broken")
            self._died_with(request, print_, upstream, f"stream broke: {exc!r}")
            await out.write(shape.broken(f"the worker {upstream.url} stopped mid-stream: {exc}"))
        else:
            if responses is not None and responses.named is not None:
                self.affinity.remember(responses.named, upstream.url)
        await out.write_eof()
        return out
