"""A stand-in for a worker pod's LoRA API, for the operator's adapter sync: ``GET /v1/models``
lists the base model and each adapter with ``parent`` and ``root`` as the worker does, ``POST
/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` change them and are recorded. A path
in ``refuse`` gets the worker's 400 with that message; with ``key`` set, every call without
``Authorization: Bearer KEY`` gets the worker's 401. With ``lazy`` it plays a worker started
with ``--lora-load lazy``: a load only registers the path (nothing is read, nothing refused),
``GET /get_server_info`` answers ``lora_resident`` and ``lora_failed``, and ``serve(name)``
plays a request that reads the adapter into a device slot. It runs on a loopback port in its
own thread and event loop (the operator's runs in another)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web

BASE_MODEL = "smollm2-135m"


class FakeLoRAWorker:
    def __init__(
        self,
        adapters: dict[str, str],
        *,
        key: str | None,
        refuse: dict[str, str],
        lazy: bool = False,
    ):
        self.adapters = dict(adapters)  # what it read (or, lazy, learnt) at start
        self.key = key
        self.refuse = refuse
        self.lazy = lazy
        self.resident: list[str] = []  # lazy: the adapters requests have read into a slot
        self.failed: dict[str, str] = {}  # lazy: the adapters whose read failed, and why
        self.calls: list[tuple[str, dict[str, Any]]] = []  # (path, body) of each admin call
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(),))

    def __enter__(self) -> FakeLoRAWorker:
        self._thread.start()
        assert self._started.wait(10), "the fake worker did not start"
        return self

    def __exit__(self, *_: object) -> None:
        assert self._stopping is not None
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(10)

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/load_lora_adapter", self._load)
        app.router.add_post("/v1/unload_lora_adapter", self._unload)
        app.router.add_get("/get_server_info", self._server_info)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._started.set()
        await self._stopping.wait()
        await runner.cleanup()

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.key and request.headers.get("Authorization") != f"Bearer {self.key}":
            return _error(401, "invalid API key", "invalid_api_key")
        return await handler(request)

    async def _models(self, request: web.Request) -> web.Response:
        cards = [{"id": BASE_MODEL, "object": "model", "owned_by": "radixserve"}]
        cards += [
            {"id": name, "object": "model", "parent": BASE_MODEL, "root": path}
            for name, path in self.adapters.items()
        ]
        return web.json_response({"object": "list", "data": cards})

    async def _load(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("load", body))
        name, path = body["lora_name"], body["lora_path"]
        if path in self.refuse and not self.lazy:
            return _error(400, self.refuse[path], "lora_load_failed")
        self.adapters[name] = path
        return web.json_response({"success": True, "message": f"LoRA adapter {name} loaded"})

    async def _unload(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("unload", body))
        if self.adapters.pop(body["lora_name"], None) is None:
            return _error(404, "not loaded", "model_not_found")
        return web.json_response({"success": True})

    async def _server_info(self, request: web.Request) -> web.Response:
        if not self.lazy:
            return web.json_response({"lora_adapters": self.adapters})
        info = {"lora_resident": self.resident, "lora_failed": self.failed}
        return web.json_response({"lora_adapters": self.adapters, **info})

    def serve(self, name: str) -> None:
        """A request for `name` on a lazy worker: its path is read (a refused one fails)."""
        path = self.adapters[name]
        if path in self.refuse:
            self.failed[name] = self.refuse[path]
        elif name not in self.resident:
            self.resident.append(name)


def _error(status: int, message: str, code: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    return web.json_response(body, status=status)
