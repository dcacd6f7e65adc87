"""The worker's HTTP front end: OpenAI-compatible and native endpoints, probes, metrics, drain.

Handlers are thin: `frontend/openai` validates, templates and shapes (the native
`/generate` goes through the Engine), the TokenizerManager's front door builds the inputs, and
handlers write JSON or server-sent events. Middlewares give every request its id (the client's
X-Request-Id or a new one, echoed on every reply), render errors in OpenAI's shape and check
API keys. aiohttp cancels a handler whose client disconnects (`handler_cancellation=True`),
and cancellation closes the generation stream, which aborts the request in the scheduler and
frees its KV slots (`request_log` notes the disconnect in one debug line and, with
`--log-requests`, logs each finished request).

Lifecycle (`server_launch.run_server` starts it): the listening port is bound before the model
loads (a port in use fails at once, and nothing can take the port meanwhile). SIGTERM (or
SIGINT) makes `/ready` answer 503 at once and new generation requests get 503 + Retry-After,
while requests already in flight run to completion for at most `--drain-timeout` seconds; then
the rest are aborted, the scheduler process is stopped and the process exits 0. A scheduler
process that dies unexpectedly (a crash, its hang watchdog) fails the requests in flight with
503 and the process exits 1 within a second or two, so that the pod restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from radixserve.api_errors import (
    RETRY_AFTER_S,
    APIError,
    InvalidParameterError,
    endpoints_of,
    error_response,
    http_exception_error,
)
from radixserve.api_keys import api_key_guard
from radixserve.frontend import native
from radixserve.frontend.anthropic.http import anthropic_errors, stream_events
from radixserve.frontend.anthropic.serving import AnthropicServing
from radixserve.frontend.embeddings.serving import PoolingServing
from radixserve.frontend.engine import Engine
from radixserve.frontend.openai.protocol import (
    FieldPolicy,
    GenerateRequestBody,
    decode_body,
    parse_request,
)
from radixserve.frontend.openai.responses import model_card
from radixserve.frontend.openai.serving import OpenAIServing, PreparedRequest
from radixserve.frontend.openai_responses.serving import ResponsesServing
from radixserve.frontend.openai_responses.sse import write_events
from radixserve.frontend.request_log import (
    LOG_REQUESTS_KEY,
    MODEL_NAME_KEY,
    record_of,
    request_lifecycle,
)
from radixserve.frontend.tokenizer_manager import (
    GenerateRequest,
    GenerationError,
    QueueFullError,
    RequestAbortedError,
    SchedulerUnavailableError,
    TokenizerManager,
)
from radixserve.gc_pauses import freeze_startup_heap, pause_stats
from radixserve.logging_config import escape_control
from radixserve.metrics.collectors import METRICS_CONTENT_TYPE
from radixserve.sampling.sampling_params import SAMPLING_PARAM_FIELDS
from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
# bodies up to this size are decoded on the event loop (well under a millisecond)
INLINE_DECODE_BYTES = 1024 * 1024
# Requests still running when the drain ends are aborted; their handlers get this long to reply.
ABORT_GRACE_S = 5.0
# How often serving checks that its scheduler process lives; once it is gone, the handlers of
# the requests it failed get this long to send their 503 before the process exits with this.
SCHEDULER_WATCH_S = 0.2
SCHEDULER_DEATH_GRACE_S = 1.0
SCHEDULER_DIED_EXIT_STATUS = 1

REQUEST_ID_HEADER = "X-Request-Id"
MAX_REQUEST_ID_LENGTH = 256
_REQUEST_ID = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces
# Paths that answer without a key: probes and scrapers cannot hold secrets.

ENGINE_KEY = web.AppKey("engine", Engine)
REQUEST_ID_KEY = web.RequestKey("request_id", str)


@dataclasses.dataclass
class ServerState:
    draining: bool = False
    in_flight: int = 0


STATE_KEY = web.AppKey("state", ServerState)


# ---------------------------------------------------------------------------- errors


def as_api_error(exc: Exception) -> APIError:
    """Map engine exceptions onto OpenAI's error types and HTTP statuses."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, QueueFullError):
        return APIError(
            f"the server is overloaded: {exc}",
            status=429,
            type="rate_limit_error",
            code="queue_full",
            retry_after=RETRY_AFTER_S,
        )
    if isinstance(exc, SchedulerUnavailableError | RequestAbortedError):
        return APIError(
            str(exc), status=503, type="server_error", code="unavailable", retry_after=RETRY_AFTER_S
        )
    if isinstance(exc, GenerationError):
        return APIError(str(exc), status=500, type="server_error")
    if isinstance(exc, RecursionError):
        # only a client's input nests this deep (the body's and schemas' own limits are
        # checked first): its fault, whichever library recursed on it
        logger.warning("a request nested too deeply for %s", _recursed_in(exc))
        return APIError("the request nests too deeply to be processed", status=400)
    logger.exception("unexpected error", exc_info=exc)
    return APIError("internal server error", status=500, type="server_error")


def _recursed_in(exc: BaseException) -> str:
    """Where a RecursionError was raised: the innermost frame's file and function."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return "an unknown function"
    return f"{tb.tb_frame.f_code.co_name} ({tb.tb_frame.f_code.co_filename})"


@web.middleware
async def request_ids(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The client's X-Request-Id (or a new one) becomes the request id: scheduler request ids,
    response ids and log lines carry it, and every response echoes it."""
    request_id = request.headers.get(REQUEST_ID_HEADER)
    if request_id is None:
        request_id = uuid.uuid4().hex
    elif len(request_id) > MAX_REQUEST_ID_LENGTH or not _REQUEST_ID.fullmatch(request_id):
        request[REQUEST_ID_KEY] = uuid.uuid4().hex
        return error_response(
            APIError(
                f"{REQUEST_ID_HEADER} must be 1 to {MAX_REQUEST_ID_LENGTH} printable ASCII "
                "characters without spaces",
                code="invalid_request_id",
            )
        )
    request[REQUEST_ID_KEY] = request_id
    return await handler(request)


async def echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: the header goes on every reply, streams and errors included."""
    if REQUEST_ID_KEY in request:
        response.headers[REQUEST_ID_HEADER] = request[REQUEST_ID_KEY]


@web.middleware
async def openai_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ConnectionResetError:
        raise  # the client went away mid-stream: request_lifecycle notes it
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(http_exception_error(exc, request.path, endpoints_of(request.app)))
    except Exception as exc:
        error = as_api_error(exc)
        if error.status >= 500:
            logger.warning(
                "request %s failed: %s", request.get(REQUEST_ID_KEY), escape_control(error.message)
            )
        return error_response(error)


async def read_json(request: web.Request) -> Any:
    """The body as JSON; malformed, too deep or not Unicode is a 400 (`decode_body`), over
    MAX_BODY_BYTES a 413. A large body is joined and decoded on a thread: its C steps (UTF-8, JSON, the scans) each hold the GIL for
    tens of milliseconds on 60 MB, and between them the event loop runs, where on the loop
    they would hold it for their sum."""
    chunks, size = [], 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise web.HTTPRequestEntityTooLarge(MAX_BODY_BYTES, size)
        chunks.append(chunk)
    if size <= INLINE_DECODE_BYTES:
        return decode_body(b"".join(chunks))
    # joined there too: aiohttp's own read() grows one buffer and copies it on the loop
    return await asyncio.to_thread(lambda: decode_body(b"".join(chunks)))


# ---------------------------------------------------------------------------- streaming


class SSEWriter:
    """Server-sent events as OpenAI clients expect them: `data: {json}` lines, then [DONE]."""

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self._response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )

    async def send(self, payload: dict[str, Any]) -> None:
        if not self._response.prepared:
            await self._response.prepare(self._request)
        await self._response.write(f"data: {json.dumps(payload)}\n\n".encode())

    async def finish(self) -> web.StreamResponse:
        if not self._response.prepared:
            await self._response.prepare(self._request)
        await self._response.write(b"data: [DONE]\n\n")
        await self._response.write_eof()
        return self._response

    async def fail(self, error: APIError) -> web.StreamResponse:
        """Errors after the first byte can only be events; before it, a normal error reply."""
        if not self._response.prepared:
            return error_response(error)
        await self.send(error.body())
        return await self.finish()


# ---------------------------------------------------------------------------- handlers


class Handlers:
    def __init__(self, engine: Engine, state: ServerState) -> None:
        self.engine = engine
        self.tm = engine.tokenizer_manager
        self.state = state
        self.policy = FieldPolicy(strict=engine.server_args.strict_api)
        self.openai = OpenAIServing(self.tm, engine.server_args, self.policy)
        self.anthropic = AnthropicServing(self.openai)
        self.model_name = self.openai.model_name
        self.responses = ResponsesServing(self.openai, engine.server_args)
        info = engine.model_info
        self.pooling = PoolingServing(
            self.tm,
            self.policy,
            self.model_name,
            info.task,
            info.hidden_size,
            self.openai.check_model,
        )

    # -- shared plumbing

    def _admit(self, task: str = "generate") -> None:
        """Refuse a request the server cannot take now (draining: 503) or whose endpoint is
        not for the model's task (a 400 naming the task's endpoints)."""
        self.pooling.require(task)
        if self.state.draining:
            raise APIError(
                "the server is shutting down",
                status=503,
                type="server_error",
                code="draining",
                retry_after=RETRY_AFTER_S,
            )

    @contextlib.contextmanager
    def _counted(self):
        self.state.in_flight += 1
        try:
            yield
        finally:
            self.state.in_flight -= 1

    async def _reply(self, request: web.Request, prepared: PreparedRequest) -> web.StreamResponse:
        record = record_of(request)
        if record is not None:
            record.samples_per_prompt = prepared.samples_per_prompt
        with self._counted():
            if not prepared.stream:
                return web.json_response(await prepared.response())
            return await _stream(request, prepared.events())

    @staticmethod
    def _observer(request: web.Request) -> Callable[[int, Any], None] | None:
        """What the request's log record (with --log-requests) learns each chunk from."""
        record = record_of(request)
        if record is None:
            return None
        record.id = request[REQUEST_ID_KEY]
        return record.observe

    # -- OpenAI

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self._admit()
        body = await read_json(request)
        prepared = await self.openai.prepare_completion(
            body, request[REQUEST_ID_KEY], self._observer(request)
        )
        return await self._reply(request, prepared)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        self._admit()
        body = await read_json(request)
        prepared = await self.openai.prepare_chat(
            body, request[REQUEST_ID_KEY], self._observer(request)
        )
        return await self._reply(request, prepared)

    async def tokenize(self, request: web.Request) -> web.Response:
        return web.json_response(await self.openai.tokenize(await read_json(request)))

    # -- Anthropic (errors in its shape: anthropic.http.anthropic_errors)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        self._admit()
        body = await read_json(request)
        prepared = await self.anthropic.prepare(
            body, request[REQUEST_ID_KEY], self._observer(request)
        )
        if not prepared.stream:
            return await self._reply(request, prepared)
        with self._counted():
            return await stream_events(request, prepared.events(), as_api_error)

    async def count_message_tokens(self, request: web.Request) -> web.Response:
        return web.json_response(await self.anthropic.count_tokens(await read_json(request)))

    # -- OpenAI Responses API (frontend/openai_responses)

    async def create_response(self, request: web.Request) -> web.StreamResponse:
        self._admit()
        body = await read_json(request)
        prepared = await self.responses.prepare(
            body, request[REQUEST_ID_KEY], self._observer(request)
        )
        with self._counted():
            if not prepared.stream:
                return web.json_response(await prepared.response())
            return await write_events(
                request, prepared.events(), prepared.error_event, as_api_error
            )

    async def get_response(self, request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        return web.json_response(await self.responses.retrieve(response_id))

    async def delete_response(self, request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        return web.json_response(await self.responses.delete(response_id))

    # -- pooling (frontend/embeddings): --task embed and rerank

    async def embeddings(self, request: web.Request) -> web.Response:
        self._admit("embed")
        body = await read_json(request)
        with self._counted():
            text = await self.pooling.embeddings(
                body, request[REQUEST_ID_KEY], self._observer(request)
            )
        return web.Response(text=text, content_type="application/json")

    async def rerank(self, request: web.Request) -> web.Response:
        self._admit("rerank")
        body = await read_json(request)
        with self._counted():
            reply = await self.pooling.rerank(
                body, request[REQUEST_ID_KEY], self._observer(request)
            )
            return web.json_response(reply)

    async def score(self, request: web.Request) -> web.Response:
        self._admit("rerank")
        body = await read_json(request)
        with self._counted():
            reply = await self.pooling.score(body, request[REQUEST_ID_KEY], self._observer(request))
            return web.json_response(reply)

    # -- native API

    async def generate(self, request: web.Request) -> web.StreamResponse:
        self._admit()
        req: GenerateRequestBody = parse_request(
            GenerateRequestBody, await read_json(request), self.policy
        )
        generate_request, batched = GenerateRequest.native(
            req.text,
            req.input_ids,
            req.known_sampling_params(SAMPLING_PARAM_FIELDS, self.policy),
            req.return_logprob,
            req.top_logprobs_num,
            request[REQUEST_ID_KEY],
        )
        if req.model is not None:
            generate_request.lora_name = self.openai.check_model(req.model)
        self.tm.check_fits_queue(generate_request)
        record = record_of(request)
        if record is not None:
            record.id = request[REQUEST_ID_KEY]
        with self._counted():
            if not req.stream:
                results = await native.generate(self.tm, generate_request)
                if record is not None:
                    for index, result in enumerate(results):
                        record.observe_native(index, result, streamed=False)
                return web.json_response(results if batched or len(results) > 1 else results[0])
            items = native.generate_stream(self.tm, generate_request)
            if record is not None:
                items = record.observed_native(items)
            return await _stream(request, items)

    # -- the rest

    async def models(self, request: web.Request) -> web.Response:
        cards = [self._card(None)] + [self._card(name) for name in self.tm.lora_adapters]
        return web.json_response({"object": "list", "data": cards})

    async def model(self, request: web.Request) -> web.Response:
        lora_name = self.openai.check_model(request.match_info["model_id"])
        return web.json_response(self._card(lora_name))

    def _card(self, lora_name: str | None) -> dict[str, Any]:
        """The base model's card, or a LoRA adapter's (vLLM's: `parent` the base, `root` its
        path)."""
        context = self.engine.model_info.context_len
        if lora_name is None:
            return model_card(self.model_name, context)
        path = self.tm.lora_adapters[lora_name]
        return {**model_card(lora_name, context), "parent": self.model_name, "root": path}

    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        """`POST /v1/load_lora_adapter {"lora_name", "lora_path"}` (vLLM's): a 400 saying why
        an adapter cannot be served, and nothing served changes."""
        name, path = lora_request_fields(await read_json(request), with_path=True)
        if name == self.model_name:
            raise InvalidParameterError("lora_name is the base model's name", "lora_name")
        reply = await self.tm.change_lora_adapter(name, path)
        if not reply.success:
            raise APIError(reply.message, param="lora_path", code="lora_load_failed")
        return web.json_response({"success": True, "message": f"LoRA adapter {name} loaded"})

    async def unload_lora_adapter(self, request: web.Request) -> web.Response:
        """`POST /v1/unload_lora_adapter {"lora_name"}`: a 404 for a name not loaded."""
        name, _ = lora_request_fields(await read_json(request), with_path=False)
        reply = await self.tm.change_lora_adapter(name, None)
        if not reply.success:
            raise APIError(reply.message, status=404, param="lora_name", code="model_not_found")
        return web.json_response({"success": True, "message": f"LoRA adapter {name} unloaded"})

    async def health(self, request: web.Request) -> web.Response:
        if not self.tm.scheduler_alive:
            return web.json_response({"status": "scheduler down"}, status=503)
        hung = hang_problem(self.tm, self.engine.server_args.watchdog_timeout)
        if hung is not None:
            return web.json_response({"status": "scheduler hung", "reason": hung}, status=503)
        return web.json_response({"status": "ok"})

    async def ready(self, request: web.Request) -> web.Response:
        reason = readiness_problem(
            self.state, self.tm, self.engine.server_args.scheduler_stall_timeout
        )
        if reason is not None:
            return web.json_response({"status": "not ready", "reason": reason}, status=503)
        return web.json_response({"status": "ready"})

    async def metrics(self, request: web.Request) -> web.Response:
        body = self.engine.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def get_model_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.engine.get_model_info())

    async def get_server_info(self, request: web.Request) -> web.Response:
        info = await self.engine.async_get_server_info()
        info.update(draining=self.state.draining, in_flight_http_requests=self.state.in_flight)
        info["frontend"] = pause_stats()  # this process's collections; the scheduler's at the top
        return web.json_response(info, dumps=lambda o: json.dumps(o, default=str))

    async def flush_cache(self, request: web.Request) -> web.Response:
        reply = await self.tm.flush_cache()
        if not reply.success:
            raise APIError(f"cache not flushed: {reply.message}", code="cache_busy")
        return web.json_response({"success": True, "message": reply.message})


async def _stream(
    request: web.Request, events: AsyncIterator[dict[str, Any]]
) -> web.StreamResponse:
    """Server-sent events; a failure before the first event is an ordinary error reply."""
    sse = SSEWriter(request)
    try:
        async with contextlib.aclosing(events):
            async for event in events:
                await sse.send(event)
    except APIError as exc:
        return await sse.fail(exc)
    except (SchedulerUnavailableError, RequestAbortedError, GenerationError) as exc:
        return await sse.fail(as_api_error(exc))
    return await sse.finish()


def readiness_problem(state: ServerState, tm: TokenizerManager, stall_timeout: float) -> str | None:
    """Why this pod should get no traffic now, or None. A busy queue is no reason: a saturated
    pod whose scheduler keeps stepping stays ready; a scheduler loop that stops reporting (a
    step's outputs, or its idle heartbeat) is one."""
    if state.draining:
        return "draining"
    if not tm.scheduler_alive:
        return "the scheduler process is down"
    silent = time.monotonic() - tm.last_scheduler_report
    if silent > stall_timeout:
        return f"the scheduler loop has not reported for {silent:.0f}s (a stuck step?)"
    return None


def hang_problem(tm: TokenizerManager, watchdog_timeout: float) -> str | None:
    """Why the scheduler counts as hung, or None: requests are pending and it has not reported
    (a step's outputs, or its idle heartbeat) for longer than --watchdog-timeout. Its own
    watchdog ends it about then; this also covers a scheduler too stuck to run that (stopped,
    or swapped out). An idle scheduler that went silent is a readiness matter only."""
    if watchdog_timeout <= 0 or not tm.num_in_flight:
        return None
    silent = time.monotonic() - tm.last_scheduler_report
    if silent <= watchdog_timeout:
        return None
    return (
        f"the scheduler has not reported for {silent:.0f}s with {tm.num_in_flight} requests "
        f"pending (--watchdog-timeout {watchdog_timeout:g}s)"
    )


def build_app(engine: Engine, state: ServerState) -> web.Application:
    args = engine.server_args
    middlewares = [
        request_lifecycle,
        anthropic_errors,
        request_ids,
        openai_errors,
        api_key_guard(
            args.api_key,
            args.admin_api_key or args.api_key,
            lambda r: r[REQUEST_ID_KEY],
            logger,
        ),
    ]
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app.on_response_prepare.append(echo_request_id)
    app[ENGINE_KEY] = engine
    app[STATE_KEY] = state
    h = Handlers(engine, state)
    app[LOG_REQUESTS_KEY] = args.log_requests
    app[MODEL_NAME_KEY] = h.model_name
    app.router.add_post("/v1/completions", h.completions)
    app.router.add_post("/v1/chat/completions", h.chat_completions)
    app.router.add_post("/v1/responses", h.create_response)
    app.router.add_get("/v1/responses/{response_id}", h.get_response)
    app.router.add_delete("/v1/responses/{response_id}", h.delete_response)
    app.router.add_get("/v1/models", h.models)
    app.router.add_get("/v1/models/{model_id:.+}", h.model)
    app.router.add_post("/v1/messages", h.messages)
    app.router.add_post("/v1/messages/count_tokens", h.count_message_tokens)
    app.router.add_post("/generate", h.generate)
    app.router.add_post("/tokenize", h.tokenize)
    app.router.add_post("/v1/embeddings", h.embeddings)
    app.router.add_post("/v1/rerank", h.rerank)
    app.router.add_post("/v1/score", h.score)
    app.router.add_get("/health", h.health)
    app.router.add_get("/ready", h.ready)
    app.router.add_get("/metrics", h.metrics)
    app.router.add_get("/get_model_info", h.get_model_info)
    app.router.add_get("/get_server_info", h.get_server_info)
    app.router.add_post("/flush_cache", h.flush_cache)
    app.router.add_post("/v1/load_lora_adapter", h.load_lora_adapter)
    app.router.add_post("/v1/unload_lora_adapter", h.unload_lora_adapter)
    return app


# ---------------------------------------------------------------------------- serving


async def serve(engine: Engine, server_args: ServerArgs, listener: socket.socket) -> int:
    """Serve on `listener` until SIGTERM/SIGINT, then drain and shut the engine down: exit
    status 0. A scheduler process that dies meanwhile (a crash, its watchdog) ends the serving
    instead: its in-flight requests have failed with 503, their handlers get a moment to reply,
    and the status is SCHEDULER_DIED_EXIT_STATUS, so that Kubernetes restarts the pod rather
    than keep a front end that can only answer 503."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await engine.start()
    state = ServerState()
    runner = web.AppRunner(
        build_app(engine, state),
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=ABORT_GRACE_S,
    )
    await runner.setup()
    site = web.SockSite(runner, listener)
    await site.start()
    engine.startup.add("ready", time.perf_counter() - engine.scheduler_ready_at)
    engine.metrics.set_startup(engine.startup.seconds)
    logger.info("startup: %s", engine.startup.summary())
    logger.info(
        "serving %r on http://%s:%d (KV capacity %d tokens)",
        engine.server_args.served_model_name,
        server_args.host,
        server_args.port,
        engine.model_info.max_total_tokens,
    )
    # the event loop serves every stream: none may stop for a full collection over the
    # start-up heap (the HTTP stack, the tokenizer's Python side)
    freeze_startup_heap()
    tm = engine.tokenizer_manager
    while not stop.is_set():
        if not tm.scheduler_alive:
            return await _exit_without_scheduler(engine, state, runner)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SCHEDULER_WATCH_S)
    state.draining = True
    logger.info(
        "draining: %d requests in flight, waiting up to %.0fs",
        state.in_flight,
        server_args.drain_timeout,
    )
    await _wait_for(lambda: state.in_flight == 0, server_args.drain_timeout)
    if state.in_flight:
        logger.warning("drain timeout: aborting %d requests", state.in_flight)
        await engine.tokenizer_manager.abort_all()
        await _wait_for(lambda: state.in_flight == 0, ABORT_GRACE_S)
    await runner.cleanup()
    await engine.async_shutdown()
    logger.info("shut down cleanly")
    return 0


async def _exit_without_scheduler(engine: Engine, state: ServerState, runner: web.AppRunner) -> int:
    logger.error(
        "the scheduler process is gone: shutting down with exit status %d so that the pod "
        "restarts (%d requests in flight failed with 503)",
        SCHEDULER_DIED_EXIT_STATUS,
        state.in_flight,
    )
    await _wait_for(lambda: state.in_flight == 0, SCHEDULER_DEATH_GRACE_S)
    await runner.cleanup()
    await engine.async_shutdown()
    return SCHEDULER_DIED_EXIT_STATUS


async def _wait_for(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def lora_request_fields(body: Any, with_path: bool) -> tuple[str, str | None]:
    """`lora_name` (and `lora_path`) of a load or unload body, each a non-empty string."""
    if not isinstance(body, dict):
        raise InvalidParameterError("the body must be a JSON object", None)
    names = ("lora_name", "lora_path") if with_path else ("lora_name",)
    for field_name in names:
        value = body.get(field_name)
        if not isinstance(value, str) or not value:
            raise InvalidParameterError(f"{field_name} must be a non-empty string", field_name)
    return body["lora_name"], body.get("lora_path") if with_path else None
