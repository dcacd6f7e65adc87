"""The request_lifecycle middleware, on an aiohttp test server: request lines and disconnects."""

from __future__ import annotations

import logging

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from radixserve.frontend.http_server import openai_errors
from radixserve.frontend.request_log import (
    LOG_REQUESTS_KEY,
    MODEL_NAME_KEY,
    RequestRecord,
    record_of,
    request_lifecycle,
)
from radixserve.frontend.tokenizer_manager import GenerateChunk


def app_with(handler, log_requests: bool = True) -> web.Application:
    app = web.Application(middlewares=[request_lifecycle, openai_errors])
    app[LOG_REQUESTS_KEY] = log_requests
    app[MODEL_NAME_KEY] = "m"
    app.router.add_post("/v1/completions", handler)
    app.router.add_get("/health", handler)
    return app


def chunk(tokens: list[int], completion: int, finish: str | None = None) -> GenerateChunk:
    reason = {"type": finish} if finish else None
    return GenerateChunk("r", "x", tokens, [], reason, 7, completion, 3)


@pytest.mark.asyncio
async def test_a_write_after_the_client_left_is_one_debug_line(caplog) -> None:
    """aiohttp raises ConnectionResetError when a handler writes to a closed connection; left
    alone, aiohttp logs it as 'Error handling request' with a traceback, once per stream."""

    async def streaming(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"data: {}\n\n")
        request.transport.close()  # the client is gone
        await response.write(b"data: {}\n\n")
        raise AssertionError("unreachable: the write raises")

    caplog.set_level(logging.DEBUG)
    async with TestClient(TestServer(app_with(streaming))) as client:
        with pytest.raises(aiohttp.ClientError):
            reply = await client.post("/v1/completions", json={})
            await reply.read()
    messages = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    notes = [m for m in messages if m[2].startswith("client disconnected")]
    assert notes == [("radixserve.frontend.request_log", logging.DEBUG, notes[0][2])]
    assert not [m for m in messages if "Error handling request" in m[2]]
    (line,) = [r for r in caplog.records if r.name == "radixserve.requests"]
    assert line.status == 499 and line.getMessage().startswith("request id=- model=m ")


@pytest.mark.asyncio
async def test_request_lines_only_for_generation_and_only_when_asked(caplog) -> None:
    async def answer(request: web.Request) -> web.Response:
        record = record_of(request)
        if record is not None:
            record.id = "cmpl-1"
            record.observe(0, chunk([5], 1))
            record.observe(0, chunk([6, 7], 3, "length"))
        return web.json_response({})

    caplog.set_level(logging.INFO)
    for log_requests in (True, False):
        async with TestClient(TestServer(app_with(answer, log_requests))) as client:
            assert (await client.post("/v1/completions", json={})).status == 200
            assert (await client.get("/health")).status == 200
    (line,) = [r for r in caplog.records if r.name == "radixserve.requests"]
    assert (line.id, line.status, line.path, line.finish_reason) == (
        "cmpl-1",
        200,
        "/v1/completions",
        "length",
    )
    assert (line.prompt_tokens, line.completion_tokens, line.cached_tokens) == (7, 3, 3)
    assert 0 <= line.ttft_s <= line.e2e_s


def test_prompt_tokens_count_once_per_prompt_of_n_samples() -> None:
    record = RequestRecord(model="m", path="/v1/completions", samples_per_prompt=2)
    for index in range(4):  # two prompts, two samples each
        record.observe(index, chunk([1], 2, "stop"))
    fields = record.fields(200)
    assert (fields["prompt_tokens"], fields["completion_tokens"], fields["cached_tokens"]) == (
        14,
        8,
        6,
    )
    assert fields["finish_reason"] == "stop"
