"""In-process routers and scripted stand-in workers, for the router's HTTP behaviour.

A `ScriptedWorker` speaks the worker's HTTP surface (`/ready`, `/metrics`, `/v1/completions`,
`/flush_cache`, `/get_server_info`; Anthropic's `/v1/messages` and `/v1/messages/count_tokens`,
`/v1/models/{id}`, and the Responses API with a store of its own) and answers the way a test
scripts it: normally, with an
error status, with a stream that breaks after N events, or with a stream that waits until the
client goes away, or dying of a poison request. `main` runs one in its own process (for a real
router process in front of workers that really exit). Real-worker behaviour (the model, the
radix cache, SIGTERM, SIGKILL) is tested against `radixserve serve` processes in
`test_router_fleet.py` and `test_router_failover.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from radixserve.api_errors import ERROR_CODE_HEADER, error_body
from radixserve.router.args import RouterArgs
from radixserve.router.discovery import EndpointSliceDiscovery
from radixserve.router.server import Router, build_app


def routing_decisions(router: Any) -> dict[str, float]:
    """A router process's requests by routing decision (its metrics' `decision` label):
    `router` has `.get(path)` -> (status, body), as `ServerProcess` does."""
    text = router.get("/metrics")[1].decode()
    found: dict[str, float] = {}
    for labels, value in re.findall(r"radixserve_router_requests_total\{([^}]*)\} (\S+)", text):
        decision = re.search(r'decision="([^"]+)"', labels)
        assert decision
        found[decision.group(1)] = found.get(decision.group(1), 0) + float(value)
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


SCHEDULER_GONE = "the scheduler process exited"


@dataclass
class ScriptedWorker:
    """What the next completions answer: `mode` is ok | status | stream | break | truncate |
    hang (a stream that waits for the client to go away). `status` mode answers `status` with
    error code `code` (default `code_<status>`).

    A request whose prompt contains `poison` makes the worker die instead, as `poison_death`
    says: `scheduler_gone` (503 `unavailable`, as a worker whose scheduler exited answers, and
    `/ready` 503 from then on), `disconnect` (the connection drops after the request arrived)
    or `exit` (the process exits at once: for a worker in its own process, `main` below)."""

    name: str
    mode: str = "ok"
    status: int = 200
    code: str | None = None
    poison: str | None = None
    poison_death: str = "scheduler_gone"
    record: str | None = None  # a file that gets each request's JSON, one a line
    events: int = 3
    ready: bool = True
    queued: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    aborted: int = 0
    flushed: int = 0
    dead: bool = False
    hang_admin: bool = False  # /flush_cache and /get_server_info never answer
    admin_key: str | None = None  # /flush_cache and /get_server_info want this bearer key
    drop_models: bool = False  # /v1/models drops the connection
    models_asked: int = 0
    extra_metrics: str = ""  # more /metrics lines (a LoRA gauge, say)
    api_keys: list[str | None] = field(default_factory=list)  # each request's x-api-key
    stored: set[str] = field(default_factory=set)  # the ids of the responses it made
    port: int = field(default_factory=free_port)
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> ScriptedWorker:
        app = web.Application()
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model_id:.+}", self._model)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_post("/v1/responses", self._create_response)
        app.router.add_get("/v1/responses/{response_id}", self._get_response)
        app.router.add_delete("/v1/responses/{response_id}", self._delete_response)
        app.router.add_post("/flush_cache", self._flush)
        app.router.add_get("/get_server_info", self._info)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _ready(self, request: web.Request) -> web.Response:
        if self.dead:
            return web.json_response({"status": "scheduler down"}, status=503)
        if self.ready:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "not ready", "reason": "draining"}, status=503)

    async def _health(self, request: web.Request) -> web.Response:
        if self.dead:
            return web.json_response({"status": "scheduler down"}, status=503)
        return web.json_response({"status": "ok"})

    async def _metrics(self, request: web.Request) -> web.Response:
        text = (
            "# TYPE radixserve_num_queued_requests gauge\n"
            f'radixserve_num_queued_requests{{model_name="m"}} {self.queued}\n'
            "# TYPE radixserve_num_running_requests gauge\n"
            'radixserve_num_running_requests{model_name="m"} 0.0\n'
        )
        return web.Response(text=text + self.extra_metrics)

    async def _models(self, request: web.Request) -> web.Response:
        self.models_asked += 1
        if self.drop_models:
            assert request.transport is not None
            request.transport.abort()
        return web.json_response({"object": "list", "data": [{"id": self.name}]})

    async def _model(self, request: web.Request) -> web.Response:
        self.api_keys.append(request.headers.get("x-api-key"))
        model_id = request.match_info["model_id"]
        return web.json_response({"id": model_id, "object": "model", "owned_by": self.name})

    async def _body(self, request: web.Request) -> dict[str, Any]:
        body = await request.json()
        self.requests.append(body)
        self.api_keys.append(request.headers.get("x-api-key"))
        return body

    async def _events(
        self, request: web.Request, events: list[tuple[str, dict[str, Any]]]
    ) -> web.StreamResponse:
        """`event:` + `data:` events (no [DONE]); in `break` mode the connection dies before
        the last one."""
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for index, (name, data) in enumerate(events):
            if self.mode == "break" and index == len(events) - 1:
                await out.write(b"event: " + name.encode() + b"\ndata: {")
                assert request.transport is not None
                request.transport.abort()
                return out
            await out.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
            await asyncio.sleep(0.01)
        await out.write_eof()
        return out

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if self.mode == "status":
            kind = "overloaded_error" if self.status == 503 else "invalid_request_error"
            error = {"type": "error", "error": {"type": kind, "message": f"{self.name} says no"}}
            # the code rides in a header, as the real worker's error replies carry it
            code = "unavailable" if self.dead else "draining" if not self.ready else None
            headers = {ERROR_CODE_HEADER: code} if code is not None else None
            return web.json_response(error, status=self.status, headers=headers)
        message = {"id": "msg_1", "type": "message", "role": "assistant", "model": self.name}
        text = {"type": "text", "text": f"from {self.name}"}
        if not body.get("stream"):
            return web.json_response({**message, "content": [text], "stop_reason": "end_turn"})
        delta = {"type": "text_delta", "text": f"from {self.name}"}
        return await self._events(
            request,
            [
                ("message_start", {"type": "message_start", "message": {**message, "content": []}}),
                ("content_block_start", {"type": "content_block_start", "index": 0}),
                ("ping", {"type": "ping"}),
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": delta},
                ),
                ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
                ("message_stop", {"type": "message_stop"}),
            ],
        )

    async def _count_tokens(self, request: web.Request) -> web.Response:
        await self._body(request)
        return web.json_response({"input_tokens": 7})

    @staticmethod
    def _not_found(response_id: str, param: str | None = None) -> web.Response:
        error = error_body(f"Response with id {response_id!r} not found", param=param)
        error["error"]["code"] = "not_found"
        return web.json_response(error, status=404)

    async def _create_response(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        previous = body.get("previous_response_id")
        if previous is not None and previous not in self.stored:
            return self._not_found(previous, "previous_response_id")
        response_id = f"resp_{uuid.uuid4().hex}"
        if body.get("store", True):
            self.stored.add(response_id)
        response = {"id": response_id, "object": "response", "worker": self.name}
        if not body.get("stream"):
            return web.json_response({**response, "status": "completed"})
        events = [
            ("response.created", {"response": {**response, "status": "in_progress"}}),
            ("response.output_text.delta", {"delta": f"from {self.name}"}),
            ("response.completed", {"response": {**response, "status": "completed"}}),
        ]
        return await self._events(
            request,
            [
                (name, {"type": name, **data, "sequence_number": index})
                for index, (name, data) in enumerate(events)
            ],
        )

    async def _get_response(self, request: web.Request) -> web.Response:
        self.api_keys.append(request.headers.get("x-api-key"))
        response_id = request.match_info["response_id"]
        if response_id not in self.stored:
            return self._not_found(response_id)
        return web.json_response({"id": response_id, "object": "response", "worker": self.name})

    async def _delete_response(self, request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        if response_id not in self.stored:
            return self._not_found(response_id)
        self.stored.discard(response_id)
        return web.json_response({"id": response_id, "object": "response", "deleted": True})

    def _refused(self, request: web.Request) -> web.Response | None:
        if self.admin_key is None or request.headers.get("Authorization") == (
            f"Bearer {self.admin_key}"
        ):
            return None
        error = error_body("Incorrect API key provided", code="invalid_api_key")
        return web.json_response(error, status=401)

    async def _flush(self, request: web.Request) -> web.Response:
        if refused := self._refused(request):
            return refused
        if self.hang_admin:
            await asyncio.sleep(3600)
        self.flushed += 1
        return web.json_response({"success": True})

    async def _info(self, request: web.Request) -> web.Response:
        if refused := self._refused(request):
            return refused
        if self.hang_admin:
            await asyncio.sleep(3600)
        return web.json_response({"served_model_name": self.name, "max_total_tokens": 1024})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if self.record is not None:
            with open(self.record, "a") as record:
                record.write(json.dumps(body) + "\n")
        if self.poison is not None and self.poison in str(body.get("prompt")):
            return self._die(request)
        if self.mode == "status":
            code = self.code or f"code_{self.status}"
            error = error_body(f"{self.name} says {self.status}", code=code)
            return web.json_response(error, status=self.status, headers={"Retry-After": "7"})
        if self.mode == "ok":
            return web.json_response({"worker": self.name, "prompt": body.get("prompt")})
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        try:
            for index in range(self.events):
                await out.write(
                    f"data: {json.dumps({'worker': self.name, 'i': index})}\n\n".encode()
                )
                await asyncio.sleep(0.01)
            if self.mode == "break":
                await out.write(b'data: {"partial": ')  # half an event, then the connection dies
                assert request.transport is not None
                request.transport.abort()
                return out
            if self.mode == "hang":
                await asyncio.sleep(3600)
            if self.mode != "truncate":  # truncate: a clean end, but without the last event
                await out.write(b"data: [DONE]\n\n")
        except asyncio.CancelledError:
            self.aborted += 1  # the router closed our connection: the client went away
            raise
        await out.write_eof()
        return out

    def _die(self, request: web.Request) -> web.StreamResponse:
        self.dead = True
        if self.poison_death == "exit":
            os._exit(17)
        if self.poison_death == "disconnect":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()  # never sent: the connection is gone
        error = error_body(SCHEDULER_GONE, type="server_error", code="unavailable")
        return web.json_response(error, status=503, headers={"Retry-After": "1"})

    def revive(self) -> None:
        self.dead = False


@contextlib.asynccontextmanager
async def running_router(
    discovery: EndpointSliceDiscovery | None = None, **overrides: Any
) -> AsyncIterator[tuple[Router, str]]:
    """A router (its real app) on a free port; health probes every 50 ms unless overridden.

    With `discovery` (connected already), the workers come from its EndpointSlices.
    """
    settings: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": free_port(),
        "health_check_interval": 0.05,
        "model_name": "m",
        **overrides,
    }
    router = Router(RouterArgs(**settings), discovery)
    await router.start()
    runner = web.AppRunner(build_app(router), handler_cancellation=True, shutdown_timeout=1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", settings["port"]).start()
    try:
        yield router, f"http://127.0.0.1:{settings['port']}"
    finally:
        await runner.cleanup()
        await router.close()


async def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


async def read_events(reply) -> list[Any]:
    events: list[Any] = []
    async for line in reply.content:
        if line.startswith(b"data: "):
            data = line.removeprefix(b"data: ").strip()
            events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return events


def main() -> None:
    """A scripted worker in its own process, until killed (or poisoned with `exit`):
    `python router_harness.py --port N --name NAME [--poison TEXT] [--record FILE]`."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--poison")
    parser.add_argument("--record")
    options = parser.parse_args()

    async def serve() -> None:
        worker = ScriptedWorker(
            options.name,
            port=options.port,
            poison=options.poison,
            poison_death="exit",
            record=options.record,
        )
        await worker.start()
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
