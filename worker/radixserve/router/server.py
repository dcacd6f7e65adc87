"""The router process: the worker's API in front of many workers, plus its own probes and metrics.

Routes: `POST /v1/completions`, `POST /v1/chat/completions`, `POST /generate`, `GET
/v1/models`, `GET /v1/models/{id}`, Anthropic's `POST /v1/messages` and `POST
/v1/messages/count_tokens`, and the Responses API's `POST /v1/responses`, `GET` and `DELETE
/v1/responses/{id}`, and the pooling endpoints `POST /v1/embeddings`, `/v1/rerank` and
`/v1/score` go to a worker (`proxy.py`; a stored response's requests to the worker
that holds it, `affinity.py`). The router's own errors on `/v1/messages*` are in Anthropic's
shape (`api_error_shapes`), as the worker's are. `GET /health` is the router's own liveness;
`GET /ready` is 200 only while at least one worker is ready (the pod's readiness probe uses
`/health` instead: a router with no worker must keep taking requests, and holding them, to wake
a service scaled to zero). `GET /metrics` is the router's series. `GET /get_server_info` is the
first ready worker's server info with a `router` section (policy, workers, pending requests)
added; `POST /flush_cache` flushes every ready worker, and the router's prefix tree with them
(the tree only for the workers that flushed). Each worker gets `ADMIN_WORKER_TIMEOUT_S` to
answer these two calls, and the whole call at most `ADMIN_TOTAL_TIMEOUT_S`: a hung worker shows
as failed, it does not hang the call.

Keys: with `--api-key` (or `$RADIXSERVE_API_KEY`) the router asks for `Authorization: Bearer
KEY` or `x-api-key: KEY` (Anthropic's clients) as the worker does: the admin key (`--admin-api-key`, else the API key) on the two admin
paths, the API key elsewhere, none on `/health`, `/ready` and `/metrics`; a refusal is 401
`invalid_api_key` before any side effect. The client's `Authorization` and `x-api-key` are
passed on to the workers, which check them too. Without a key of its own, the router still honours the workers'
refusal: a worker's 401/403 on an admin call makes the call a 401, with no worker listed and
no prefix tree wiped.

SIGTERM (or SIGINT): the listening socket closes and requests in flight get `--drain-timeout`
seconds to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

from radixserve.api_errors import APIError, error_response, http_exception_error
from radixserve.api_keys import api_key_guard, invalid_api_key
from radixserve.logging_config import escape_control
from radixserve.router.affinity import ResponseAffinity
from radixserve.router.apis import as_anthropic_error, is_anthropic_path
from radixserve.router.args import RouterArgs
from radixserve.router.discovery import DiscoveryError, EndpointSliceDiscovery, default_namespace
from radixserve.router.kv_index import KVEventIndex, worker_endpoint
from radixserve.router.lora_affinity import AdapterAffinity
from radixserve.router.metrics import METRICS_CONTENT_TYPE, RouterMetrics
from radixserve.router.policies import create_policy
from radixserve.router.pool import READY, UpstreamPool
from radixserve.router.proxy import FROM_WORKER, Proxy, forwarded_headers
from radixserve.router.quarantine import Quarantine

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
UPSTREAM_CONNECT_TIMEOUT_S = 10.0
ADMIN_WORKER_TIMEOUT_S = 10.0  # one worker's answer to /flush_cache or /get_server_info
ADMIN_TOTAL_TIMEOUT_S = 20.0  # /get_server_info tries the workers in turn within this
REQUEST_ID_HEADER = "X-Request-Id"


class Router:
    """What one router process owns; `start` and `close` bracket its life."""

    def __init__(self, args: RouterArgs, discovery: EndpointSliceDiscovery | None = None) -> None:
        self.args = args
        self.metrics = RouterMetrics(args.model_name)
        self.events: KVEventIndex | None = None
        if args.prefix_source == "events" and args.policy == "cache_aware":
            self.events = KVEventIndex(
                args.kv_events_port,
                args.kv_events_replay_port or None,
                args.kv_events_block_size,
                self._events_endpoints,
            )
        self.policy = create_policy(args.policy, args.policy_config(), self.events)
        # LoRA adapters stay with the workers that have them while load allows (the policy's
        # balance threshold), then the policy's prefix and load rules choose among those
        self.lora = AdapterAffinity(args.policy_config().balance_abs_threshold)

        def removed(url: str) -> None:
            self.policy.forget(url)
            self.lora.forget(url)

        self.pool = UpstreamPool(
            self.metrics, max_pending=args.max_pending, on_removed=removed, lora=self.lora
        )
        self.discovery = discovery
        self.session: aiohttp.ClientSession | None = None
        self.proxy: Proxy | None = None
        self.quarantine = Quarantine(args.quarantine_ttl)
        self.affinity = ResponseAffinity(args.response_affinity_size)
        self._prober: asyncio.Task[None] | None = None
        self._tracker: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=UPSTREAM_CONNECT_TIMEOUT_S),
            auto_decompress=False,  # bytes pass through as the worker encoded them
        )
        self.proxy = Proxy(
            session=self.session,
            pool=self.pool,
            policy=self.policy,
            metrics=self.metrics,
            max_retries=self.args.max_retries,
            pending_timeout=self.args.pending_timeout,
            quarantine=self.quarantine,
            affinity=self.affinity,
            tokenize=self.events is not None,
            lora=self.lora,
        )
        if self.discovery is not None:
            # EndpointSlices list only pods whose readiness probe passed: ready from the start.
            self.pool.set_members(self.discovery.book.urls(), state=READY)
            self.discovery.start(
                asyncio.get_running_loop(), lambda urls: self.pool.set_members(urls, state=READY)
            )
        else:
            self.pool.set_members(self.args.worker_urls)
        self._prober = asyncio.create_task(
            self.pool.run_prober(self.session, self.args.health_check_interval)
        )
        if self.events is not None:
            self._tracker = asyncio.create_task(self._track_events(self.events))

    async def _events_endpoints(self, url: str) -> tuple[str, str | None]:
        """Where `url` publishes its KV events: its server info says, else the flags do."""
        assert self.session is not None and self.events is not None
        key = self.args.admin_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            async with self.session.get(
                url + "/get_server_info",
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=ADMIN_WORKER_TIMEOUT_S),
            ) as reply:
                info = await reply.json() if reply.status == 200 else {}
        except (aiohttp.ClientError, TimeoutError, ValueError):
            info = {}
        endpoint = info.get("kv_events_endpoint") if isinstance(info, dict) else None
        if not isinstance(endpoint, str):
            return await self.events.by_port(url)
        replay = info.get("kv_events_replay_endpoint")
        return worker_endpoint(url, endpoint), (
            worker_endpoint(url, replay) if isinstance(replay, str) else None
        )

    async def _track_events(self, events: KVEventIndex) -> None:
        """Keep one KV event subscription per worker in the pool (discovery changes it)."""
        while True:
            events.track(upstream.url for upstream in self.pool.members())
            await asyncio.sleep(self.args.health_check_interval)

    async def close(self) -> None:
        if self.discovery is not None:
            self.discovery.stop()
        for task in (self._prober, self._tracker):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.events is not None:
            await self.events.close()
        if self.session is not None:
            await self.session.close()

    # -- the router's own endpoints

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def ready(self, request: web.Request) -> web.Response:
        ready = len(self.pool.ready())
        if not ready:
            return web.json_response({"status": "not ready", "ready_workers": 0}, status=503)
        return web.json_response({"status": "ready", "ready_workers": ready})

    async def metrics_text(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.exposition(), headers={"Content-Type": METRICS_CONTENT_TYPE}
        )

    def describe(self) -> dict[str, object]:
        described: dict[str, object] = {
            "policy": self.args.policy,
            "pending_requests": self.pool.pending,
            "workers": [upstream.describe() for upstream in self.pool.members()],
        }
        if self.events is not None:
            described["kv_events"] = self.events.describe()
        if self.lora.known:  # the adapters the workers list: what adapter requests can name
            described["lora_adapters"] = sorted(self.lora.known)
        return described

    async def server_info(self, request: web.Request) -> web.Response:
        assert self.session is not None
        info: dict[str, object] = {}
        failed: dict[str, str] = {}
        headers = forwarded_headers(request.headers)  # the client's (admin) API key, if any
        deadline = time.monotonic() + ADMIN_TOTAL_TIMEOUT_S
        for upstream in self.pool.ready():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                failed[upstream.url] = "not asked: the call's time ran out"
                continue
            timeout = aiohttp.ClientTimeout(total=min(ADMIN_WORKER_TIMEOUT_S, remaining))
            try:
                url = upstream.url + "/get_server_info"
                async with self.session.get(url, headers=headers, timeout=timeout) as reply:
                    if reply.status in (401, 403):
                        return invalid_api_key()  # the workers refuse this client's key
                    answer = await reply.json() if reply.status == 200 else None
                    if isinstance(answer, dict):
                        info = answer
                        break
                    failed[upstream.url] = f"HTTP {reply.status}"
            except TimeoutError:
                failed[upstream.url] = f"timed out after {timeout.total:g}s"
            except (aiohttp.ClientError, ValueError) as exc:
                failed[upstream.url] = repr(exc)
        router = self.describe()
        if failed:
            router["server_info_failed"] = failed
        return web.json_response({**info, "router": router})

    async def flush_cache(self, request: web.Request) -> web.Response:
        assert self.session is not None
        session = self.session
        headers = forwarded_headers(request.headers)  # the client's (admin) API key, if any
        timeout = aiohttp.ClientTimeout(total=ADMIN_WORKER_TIMEOUT_S)

        async def flush(url: str) -> str:
            try:
                async with session.post(
                    url + "/flush_cache", headers=headers, timeout=timeout
                ) as reply:
                    return "ok" if reply.status == 200 else f"HTTP {reply.status}"
            except TimeoutError:
                return f"timed out after {ADMIN_WORKER_TIMEOUT_S:g}s"
            except aiohttp.ClientError as exc:
                return repr(exc)

        urls = [upstream.url for upstream in self.pool.ready()]
        results = dict(zip(urls, await asyncio.gather(*(flush(url) for url in urls)), strict=True))
        for url, result in results.items():
            if result == "ok":  # only a flushed worker's part of the tree is stale
                self.policy.forget(url)
        if any(result in ("HTTP 401", "HTTP 403") for result in results.values()):
            return invalid_api_key()
        failed = {url: result for url, result in results.items() if result != "ok"}
        if failed:
            return error_response(
                APIError(f"cache not flushed on {failed}", 502, "server_error", code="flush_failed")
            )
        return web.json_response({"success": True, "workers": results})


@web.middleware
async def openai_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The router's own errors (unknown route, wrong method, a bug) in OpenAI's error shape."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(http_exception_error(exc))
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception:
        logger.exception("router error on %s", escape_control(request.path))
        return error_response(APIError("internal router error", 500, "server_error", code="error"))


@web.middleware
async def api_error_shapes(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The router's own errors on `/v1/messages*` (keys, retries exhausted, quarantine, unknown
    routes) in Anthropic's shape; a worker's answers (`FROM_WORKER`) pass as they are."""
    response = await handler(request)
    if (
        is_anthropic_path(request.path)
        and response.status >= 400
        and not response.get(FROM_WORKER)
        and isinstance(response, web.Response)
        and not response.prepared
        and isinstance(response.body, bytes)
    ):
        reshaped = as_anthropic_error(response.body, response.status)
        if reshaped is not None:
            response.body = reshaped
    return response


def build_app(router: Router) -> web.Application:
    assert router.proxy is not None, "start() the router first"
    guard = api_key_guard(
        router.args.api_key,
        router.args.admin_key,
        lambda r: r.headers.get(REQUEST_ID_HEADER, "-"),
        logger,
    )
    app = web.Application(
        middlewares=[api_error_shapes, openai_errors, guard], client_max_size=MAX_BODY_BYTES
    )
    for path in (
        "/v1/completions",
        "/v1/chat/completions",
        "/generate",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/responses",
        "/v1/embeddings",
        "/v1/rerank",
        "/v1/score",
    ):
        app.router.add_post(path, router.proxy.handle)
    app.router.add_get("/v1/models", router.proxy.handle)
    app.router.add_get("/v1/models/{model_id:.+}", router.proxy.handle)
    app.router.add_get("/v1/responses/{response_id}", router.proxy.handle)
    app.router.add_delete("/v1/responses/{response_id}", router.proxy.handle)
    app.router.add_get("/health", router.health)
    app.router.add_get("/ready", router.ready)
    app.router.add_get("/metrics", router.metrics_text)
    app.router.add_get("/get_server_info", router.server_info)
    app.router.add_post("/flush_cache", router.flush_cache)
    return app


async def serve(args: RouterArgs, discovery: EndpointSliceDiscovery | None) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    router = Router(args, discovery)
    await router.start()
    runner = web.AppRunner(
        build_app(router),
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=args.drain_timeout,
    )
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    source = (
        f"EndpointSlices {args.discover_selector!r}"
        if discovery
        else f"{len(args.worker_url)} URLs"
    )
    logger.info(
        "routing on http://%s:%d with %s over %s", args.host, args.port, args.policy, source
    )
    await stop.wait()
    logger.info("stopping: %d requests pending", router.pool.pending)
    await runner.cleanup()
    await router.close()


def run_router(args: RouterArgs) -> int:
    """Connect discovery (a clear error, exit 1, if it cannot), then serve until SIGTERM."""
    discovery = None
    if args.discover_selector is not None:
        discovery = EndpointSliceDiscovery(
            namespace=args.namespace or default_namespace(),
            selector=args.discover_selector,
            port=args.discover_port,
        )
        try:
            found = discovery.connect()
        except DiscoveryError as exc:
            print(f"radixserve router: {exc}", file=sys.stderr)
            return 1
        logger.info("discovery found %d ready workers", len(found))
    asyncio.run(serve(args, discovery))
    return 0
