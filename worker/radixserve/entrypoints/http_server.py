"""The worker's HTTP front end: OpenAI-compatible and native endpoints, probes, metrics, drain.

Handlers are thin: they validate with `openai_protocol`, hand token ids to the Engine's
TokenizerManager and shape its chunks into JSON or server-sent events. aiohttp cancels a
handler whose client disconnects (`handler_cancellation=True`), and cancellation closes the
generation stream, which aborts the request in the scheduler and frees its KV slots
(`request_log` notes the disconnect in one debug line and, with `--log-requests`, logs each
finished request).

Lifecycle: the listening port is bound before the model loads (a port in use fails at once,
and nothing can take the port meanwhile). SIGTERM (or SIGINT) makes `/ready` answer 503 at
once and new generation requests get 503 + Retry-After, while requests already in flight run
to completion for at most `--drain-timeout` seconds; then the rest are aborted, the scheduler
process is stopped and the process exits 0.
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
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from radixserve.entrypoints import openai_protocol as oai
from radixserve.entrypoints.engine import Engine, PromptTooLongError
from radixserve.entrypoints.request_log import (
    LOG_REQUESTS_KEY,
    MODEL_NAME_KEY,
    observed,
    record_of,
    request_lifecycle,
)
from radixserve.managers.tokenizer_manager import (
    GenerateChunk,
    GenerateInput,
    GenerationError,
    QueueFullError,
    RequestAbortedError,
    SchedulerUnavailableError,
    TokenizerManager,
)
from radixserve.metrics.collectors import METRICS_CONTENT_TYPE
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
RETRY_AFTER_S = 1
# Requests still running when the drain ends are aborted; their handlers get this long to reply.
ABORT_GRACE_S = 5.0

# SamplingParams field names in validation messages, as the OpenAI request spells them.
_OPENAI_PARAM_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}

ENGINE_KEY = web.AppKey("engine", Engine)


@dataclasses.dataclass
class ServerState:
    draining: bool = False
    in_flight: int = 0


STATE_KEY = web.AppKey("state", ServerState)


# ---------------------------------------------------------------------------- errors


def error_response(error: oai.OpenAIError) -> web.Response:
    headers = {"Retry-After": str(error.retry_after)} if error.retry_after is not None else None
    return web.json_response(error.body(), status=error.status, headers=headers)


def as_openai_error(exc: Exception) -> oai.OpenAIError:
    """Map engine exceptions onto OpenAI's error types and HTTP statuses."""
    if isinstance(exc, oai.OpenAIError):
        return exc
    if isinstance(exc, PromptTooLongError):
        return oai.OpenAIError(str(exc), code="context_length_exceeded")
    if isinstance(exc, QueueFullError):
        return oai.OpenAIError(
            f"the server is overloaded: {exc}",
            status=429,
            type="rate_limit_error",
            code="queue_full",
            retry_after=RETRY_AFTER_S,
        )
    if isinstance(exc, SchedulerUnavailableError | RequestAbortedError):
        return oai.OpenAIError(
            str(exc), status=503, type="server_error", code="unavailable", retry_after=RETRY_AFTER_S
        )
    if isinstance(exc, GenerationError):
        return oai.OpenAIError(str(exc), status=500, type="server_error")
    if isinstance(exc, ValueError):
        message = str(exc)
        match = re.match(r"(\w+) ", message)
        param = match.group(1) if match else None
        if param is not None and param not in {f.name for f in dataclasses.fields(SamplingParams)}:
            param = None
        param = _OPENAI_PARAM_NAMES.get(param, param) if param else None
        for name, openai_name in _OPENAI_PARAM_NAMES.items():
            message = message.replace(name, openai_name)
        return oai.OpenAIError(message, param=param)
    logger.exception("unexpected error", exc_info=exc)
    return oai.OpenAIError("internal server error", status=500, type="server_error")


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
        code = "not_found" if exc.status == 404 else None
        return error_response(oai.OpenAIError(exc.reason, status=exc.status, code=code))
    except Exception as exc:
        return error_response(as_openai_error(exc))


async def read_json(request: web.Request) -> Any:
    try:
        return json.loads(await request.read())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise oai.OpenAIError(f"the body is not valid JSON: {exc}") from None


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

    async def fail(self, error: oai.OpenAIError) -> web.StreamResponse:
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
        self.model_name = engine.server_args.served_model_name or engine.server_args.model

    # -- shared plumbing

    def _check_model(self, model: str) -> None:
        if model not in (self.model_name, self.engine.server_args.model):
            raise oai.OpenAIError(
                f"The model {model!r} does not exist; this server serves {self.model_name!r}",
                status=404,
                param="model",
                code="model_not_found",
            )

    def _admit(self) -> None:
        if self.state.draining:
            raise oai.OpenAIError(
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

    def _token_lists(self, prompts: list[str | list[int]]) -> list[list[int]]:
        lists = []
        for prompt in prompts:
            if isinstance(prompt, str):
                lists.append(self.tm.encode(prompt))
            else:
                if any(t < 0 or t >= self.engine.model_info.vocab_size for t in prompt):
                    raise oai.OpenAIError("prompt holds token ids outside the vocabulary")
                lists.append(prompt)
        return lists

    def _inputs(
        self,
        token_lists: list[list[int]],
        sampling_dicts: list[dict[str, Any]],
        n: int,
        return_logprob: bool,
        top_logprobs_num: int,
    ) -> list[GenerateInput]:
        for d in sampling_dicts:
            d["n"] = n
        inputs, _ = self.engine.build_inputs(
            input_ids=token_lists,
            sampling_params=sampling_dicts,
            return_logprob=return_logprob,
            top_logprobs_num=top_logprobs_num,
        )
        return inputs

    @staticmethod
    def _new_response_id(request: web.Request, prefix: str, samples_per_prompt: int) -> str:
        response_id = oai.new_id(prefix)
        record = record_of(request)
        if record is not None:
            record.id, record.samples_per_prompt = response_id, samples_per_prompt
        return response_id

    @staticmethod
    def _usage(chunks_by_index: dict[int, GenerateChunk], n: int) -> dict[str, Any]:
        prompt_tokens = cached = completion = 0
        for index, chunk in chunks_by_index.items():
            completion += chunk.completion_tokens
            if index % n == 0:  # the prompt counts once for its n samples
                prompt_tokens += chunk.prompt_tokens
                cached += chunk.cached_tokens
        return oai.usage_dict(prompt_tokens, completion, cached)

    # -- OpenAI completions

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self._admit()
        req: oai.CompletionRequest = oai.parse_request(
            oai.CompletionRequest, await read_json(request)
        )
        self._check_model(req.model)
        prompts = req.prompts()
        token_lists = self._token_lists(prompts)
        max_tokens = req.max_tokens
        dicts = []
        for ids in token_lists:
            limit = self.engine.max_request_tokens - len(ids)
            dicts.append(req.sampling_dict(max_tokens if max_tokens is not None else limit))
        want_logprobs = req.logprobs is not None
        inputs = self._inputs(token_lists, dicts, req.n, want_logprobs, req.logprobs or 0)
        echo_texts = [
            (p if isinstance(p, str) else self.tm.decode(p)) if req.echo else "" for p in prompts
        ]
        response_id = self._new_response_id(request, "cmpl", req.n)
        with self._counted():
            stream = observed(request, self.tm.generate_many(inputs))
            if req.stream:
                return await self._stream_completions(request, req, stream, response_id, echo_texts)
            texts = {i: [echo_texts[i // req.n]] for i in range(len(inputs))}
            logprobs: dict[int, list] = {i: [] for i in range(len(inputs))}
            last: dict[int, GenerateChunk] = {}
            async with contextlib.aclosing(stream):
                async for index, chunk in stream:
                    texts[index].append(chunk.text)
                    logprobs[index].extend(chunk.logprobs)
                    last[index] = chunk
            choices = [
                oai.completion_choice(
                    i,
                    "".join(texts[i]),
                    oai.completion_logprobs(logprobs[i], self.tm.token_text)
                    if want_logprobs
                    else None,
                    oai.openai_finish_reason(last[i].finish_reason),
                )
                for i in range(len(inputs))
            ]
            usage = self._usage(last, req.n)
            return web.json_response(
                oai.completion_response(response_id, self.model_name, choices, usage)
            )

    async def _stream_completions(
        self,
        request: web.Request,
        req: oai.CompletionRequest,
        stream: AsyncIterator[tuple[int, GenerateChunk]],
        response_id: str,
        echo_texts: list[str],
    ) -> web.StreamResponse:
        sse = SSEWriter(request)
        last: dict[int, GenerateChunk] = {}
        offsets: dict[int, int] = {}
        want_logprobs = req.logprobs is not None
        try:
            async with contextlib.aclosing(stream):
                async for index, chunk in stream:
                    text = chunk.text
                    if index not in offsets:
                        text = echo_texts[index // req.n] + text
                        offsets[index] = 0
                    logprobs = None
                    if want_logprobs:
                        logprobs = oai.completion_logprobs(
                            chunk.logprobs, self.tm.token_text, offsets[index]
                        )
                    offsets[index] += len(text)
                    last[index] = chunk
                    finish = oai.openai_finish_reason(chunk.finish_reason)
                    if text or finish or chunk.logprobs:
                        choice = oai.completion_choice(index, text, logprobs, finish)
                        await sse.send(
                            oai.stream_chunk(
                                "text_completion", response_id, self.model_name, [choice]
                            )
                        )
        except (SchedulerUnavailableError, RequestAbortedError, GenerationError) as exc:
            return await sse.fail(as_openai_error(exc))
        if req.include_usage_in_stream:
            usage = self._usage(last, req.n)
            await sse.send(
                oai.stream_chunk("text_completion", response_id, self.model_name, [], usage)
            )
        return await sse.finish()

    # -- OpenAI chat

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        self._admit()
        req: oai.ChatCompletionRequest = oai.parse_request(
            oai.ChatCompletionRequest, await read_json(request)
        )
        self._check_model(req.model)
        input_ids = self.tm.apply_chat_template([m.template_dict() for m in req.messages])
        max_tokens = req.requested_max_tokens
        if max_tokens is None:
            max_tokens = max(self.engine.max_request_tokens - len(input_ids), 0)
        dicts = [req.sampling_dict(max_tokens)]
        top_logprobs = req.top_logprobs or 0
        inputs = self._inputs([input_ids], dicts, req.n, req.logprobs, top_logprobs)
        response_id = self._new_response_id(request, "chatcmpl", req.n)
        with self._counted():
            stream = observed(request, self.tm.generate_many(inputs))
            if req.stream:
                return await self._stream_chat(request, req, stream, response_id)
            texts: dict[int, list[str]] = {i: [] for i in range(len(inputs))}
            logprobs: dict[int, list] = {i: [] for i in range(len(inputs))}
            last: dict[int, GenerateChunk] = {}
            async with contextlib.aclosing(stream):
                async for index, chunk in stream:
                    texts[index].append(chunk.text)
                    logprobs[index].extend(chunk.logprobs)
                    last[index] = chunk
            choices = [
                oai.chat_choice(
                    i,
                    "".join(texts[i]),
                    oai.chat_logprobs(logprobs[i], self.tm.token_text) if req.logprobs else None,
                    oai.openai_finish_reason(last[i].finish_reason),
                )
                for i in range(len(inputs))
            ]
            usage = self._usage(last, req.n)
            return web.json_response(
                oai.chat_response(response_id, self.model_name, choices, usage)
            )

    async def _stream_chat(
        self,
        request: web.Request,
        req: oai.ChatCompletionRequest,
        stream: AsyncIterator[tuple[int, GenerateChunk]],
        response_id: str,
    ) -> web.StreamResponse:
        sse = SSEWriter(request)
        last: dict[int, GenerateChunk] = {}
        name = "chat.completion.chunk"
        try:
            for index in range(req.n):
                role = oai.chat_chunk_choice(
                    index, {"role": "assistant", "content": ""}, None, None
                )
                await sse.send(oai.stream_chunk(name, response_id, self.model_name, [role]))
            async with contextlib.aclosing(stream):
                async for index, chunk in stream:
                    last[index] = chunk
                    finish = oai.openai_finish_reason(chunk.finish_reason)
                    if not (chunk.text or finish or chunk.logprobs):
                        continue
                    logprobs = None
                    if req.logprobs:
                        logprobs = oai.chat_logprobs(chunk.logprobs, self.tm.token_text)
                    delta = {"content": chunk.text} if chunk.text else {}
                    choice = oai.chat_chunk_choice(index, delta, logprobs, finish)
                    await sse.send(oai.stream_chunk(name, response_id, self.model_name, [choice]))
        except (SchedulerUnavailableError, RequestAbortedError, GenerationError) as exc:
            return await sse.fail(as_openai_error(exc))
        if req.include_usage_in_stream:
            usage = self._usage(last, req.n)
            await sse.send(oai.stream_chunk(name, response_id, self.model_name, [], usage))
        return await sse.finish()

    # -- native API

    async def generate(self, request: web.Request) -> web.StreamResponse:
        self._admit()
        body = await read_json(request)
        if not isinstance(body, dict):
            raise oai.OpenAIError("the request body must be a JSON object")
        known = {"text", "input_ids", "sampling_params", "stream", "return_logprob",
                 "top_logprobs_num"}  # fmt: skip
        unknown = sorted(set(body) - known)
        if unknown:
            raise oai.OpenAIError(f"unknown field {unknown[0]!r}", param=unknown[0])
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise oai.OpenAIError("stream must be a boolean", param="stream")
        if not isinstance(body.get("return_logprob", False), bool):
            raise oai.OpenAIError("return_logprob must be a boolean", param="return_logprob")
        kwargs = {
            "prompt": body.get("text"),
            "input_ids": body.get("input_ids"),
            "sampling_params": body.get("sampling_params"),
            "return_logprob": body.get("return_logprob", False),
            "top_logprobs_num": body.get("top_logprobs_num", 0),
        }
        record = record_of(request)
        with self._counted():
            if not stream:
                results = await self.engine.async_generate(**kwargs)
                if record is not None:
                    batch = results if isinstance(results, list) else [results]
                    for index, result in enumerate(batch):
                        record.observe_native(index, result, streamed=False)
                return web.json_response(results)
            sse = SSEWriter(request)
            items = self.engine.async_generate_stream(**kwargs)
            try:
                async with contextlib.aclosing(items):
                    async for item in items:
                        if record is not None:
                            record.observe_native(0, item, streamed=True)
                        await sse.send(item)
            except (SchedulerUnavailableError, RequestAbortedError, GenerationError) as exc:
                return await sse.fail(as_openai_error(exc))
            return await sse.finish()

    # -- the rest

    async def models(self, request: web.Request) -> web.Response:
        card = oai.model_card(self.model_name, self.engine.model_info.context_len)
        return web.json_response({"object": "list", "data": [card]})

    async def health(self, request: web.Request) -> web.Response:
        if not self.tm.scheduler_alive:
            return web.json_response({"status": "scheduler down"}, status=503)
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
        return web.json_response(info, dumps=lambda o: json.dumps(o, default=str))

    async def flush_cache(self, request: web.Request) -> web.Response:
        reply = await self.tm.flush_cache()
        if not reply.success:
            raise oai.OpenAIError(f"cache not flushed: {reply.message}", code="cache_busy")
        return web.json_response({"success": True, "message": reply.message})


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


def build_app(engine: Engine, state: ServerState) -> web.Application:
    app = web.Application(
        middlewares=[request_lifecycle, openai_errors], client_max_size=MAX_BODY_BYTES
    )
    app[ENGINE_KEY] = engine
    app[STATE_KEY] = state
    h = Handlers(engine, state)
    app[LOG_REQUESTS_KEY] = engine.server_args.log_requests
    app[MODEL_NAME_KEY] = h.model_name
    app.router.add_post("/v1/completions", h.completions)
    app.router.add_post("/v1/chat/completions", h.chat_completions)
    app.router.add_get("/v1/models", h.models)
    app.router.add_post("/generate", h.generate)
    app.router.add_get("/health", h.health)
    app.router.add_get("/ready", h.ready)
    app.router.add_get("/metrics", h.metrics)
    app.router.add_get("/get_model_info", h.get_model_info)
    app.router.add_get("/get_server_info", h.get_server_info)
    app.router.add_post("/flush_cache", h.flush_cache)
    return app


# ---------------------------------------------------------------------------- serving


async def serve(engine: Engine, server_args: ServerArgs, listener: socket.socket) -> None:
    """Serve on `listener` until SIGTERM/SIGINT, then drain and shut the engine down."""
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
    await stop.wait()
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


async def _wait_for(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def bind_listener(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound before anything slow starts: a port in use fails
    in a second, not after the model has loaded, and nobody can take it meanwhile."""
    family, _, _, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    return socket.create_server(address, family=family)


def run_server(server_args: ServerArgs) -> None:
    """Claim the port, load the model (blocking), then serve on a fresh event loop."""
    try:
        listener = bind_listener(server_args.host, server_args.port)
    except OSError as exc:
        logger.error(
            "cannot listen on %s:%d: %s; is another server running there? choose another --port",
            server_args.host,
            server_args.port,
            exc.strerror or exc,
        )
        raise SystemExit(1) from None
    # Until the loop's own handler takes over, SIGTERM during the model load exits cleanly
    # (the Engine stops the half-started scheduler on the way out).
    signal.signal(signal.SIGTERM, _exit_during_startup)
    with listener:
        engine = Engine(server_args, event_loop_thread=False, enforce_queue_limit=True)
        try:
            asyncio.run(serve(engine, server_args, listener))
        finally:
            engine.shutdown()


def _exit_during_startup(signum: int, frame: object) -> None:
    logger.info("SIGTERM while loading the model; exiting")
    raise SystemExit(0)
