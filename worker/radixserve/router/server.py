"""The router process: the worker's API in front of many workers, plus its own probes and metrics.

Routes: `POST /v1/completions`, `POST /v1/chat/completions`, `POST /generate` and
`GET /v1/models` go to a worker (`proxy.py`). `GET /health` is the router's own liveness;
`GET /ready` is 200 only while at least one worker is ready (the pod's readiness probe uses
`/health` instead: a router with no worker must keep taking requests, and holding them, to wake
a service scaled to zero). `GET /metrics` is the router's series. `GET /get_server_info` is the
first ready worker's server info with a `router` section (policy, workers, pending requests)
added; `POST /flush_cache` flushes every ready worker, and the router's prefix tree with them.
The router checks no API key itself: the workers do, on the headers it passes through (the
client's `Authorization` reaches them, for these two admin calls too).

SIGTERM (or SIGINT): the listening socket closes and requests in flight get `--drain-timeout`
seconds to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

from radixserve.api_errors import APIError, error_response, http_exception_error
from radixserve.router.args import RouterArgs
from radixserve.router.discovery import DiscoveryError, EndpointSliceDiscovery, default_namespace
from radixserve.router.metrics import METRICS_CONTENT_TYPE, RouterMetrics
from radixserve.router.policies import create_policy
from radixserve.router.pool import READY, UpstreamPool
from radixserve.router.proxy import Proxy, forwarded_headers

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
UPSTREAM_CONNECT_TIMEOUT_S = 10.0


class Router:
    """What one router process owns; `start` and `close` bracket its life."""

    def __init__(self, args: RouterArgs, discovery: EndpointSliceDiscovery | None = None) -> None:
        self.args = args
        self.metrics = RouterMetrics(args.model_name)
        self.policy = create_policy(args.policy, args.policy_config())
        self.pool = UpstreamPool(
            self.metrics, max_pending=args.max_pending, on_removed=self.policy.forget
        )
        self.discovery = discovery
        self.session: aiohttp.ClientSession | None = None
        self.proxy: Proxy | None = None
        self._prober: asyncio.Task[None] | None = None

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

    async def close(self) -> None:
        if self.discovery is not None:
            self.discovery.stop()
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
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
        return {
            "policy": self.args.policy,
            "pending_requests": self.pool.pending,
            "workers": [upstream.describe() for upstream in self.pool.members()],
        }

    async def server_info(self, request: web.Request) -> web.Response:
        assert self.session is not None
        info: dict[str, object] = {}
        headers = forwarded_headers(request.headers)  # the client's (admin) API key, if any
        for upstream in self.pool.ready():
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                url = upstream.url + "/get_server_info"
                async with self.session.get(url, headers=headers) as reply:
                    if reply.status == 200:
                        info = await reply.json()
                        break
        return web.json_response({**info, "router": self.describe()})

    async def flush_cache(self, request: web.Request) -> web.Response:
        assert self.session is not None
        session = self.session
        headers = forwarded_headers(request.headers)  # the client's (admin) API key, if any

        async def flush(url: str) -> str:
            try:
                async with session.post(url + "/flush_cache", headers=headers) as reply:
                    return "ok" if reply.status == 200 else f"HTTP {reply.status}"
            except (TimeoutError, aiohttp.ClientError) as exc:
                return repr(exc)

        urls = [upstream.url for upstream in self.pool.ready()]
        results = dict(zip(urls, await asyncio.gather(*(flush(url) for url in urls)), strict=True))
        for url in urls:
            self.policy.forget(url)
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
        logger.exception("router error on %s", request.path)
        return error_response(APIError("internal router error", 500, "server_error", code="error"))


def build_app(router: Router) -> web.Application:
    assert router.proxy is not None, "start() the router first"
    app = web.Application(middlewares=[openai_errors], client_max_size=MAX_BODY_BYTES)
    for path in ("/v1/completions", "/v1/chat/completions", "/generate"):
        app.router.add_post(path, router.proxy.handle)
    app.router.add_get("/v1/models", router.proxy.handle)
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
