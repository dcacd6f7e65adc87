"""An API that explains itself: the model card by id, a 404 that names the path and lists the
endpoints, a 405 that names the methods, `radixserve --version` and a `--help` that says what
each command is for."""

from __future__ import annotations

import subprocess
import sys

import openai
import pytest
from aiohttp import web
from scripted_server import MODEL, serve

from radixserve.api_errors import http_exception_error

ENDPOINTS = ("POST /v1/chat/completions", "GET /v1/models/{model_id}", "POST /v1/messages")


def test_models_retrieve_returns_the_card_and_a_404_names_the_id(smollm2_tokenizer):
    async def test(client, session, tm):
        card = await client.models.retrieve(MODEL)
        assert (card.id, card.object, card.owned_by) == (MODEL, "model", "radixserve")
        listed = (await client.models.list()).data[0]
        assert card.model_dump(exclude={"created"}) == listed.model_dump(exclude={"created"})
        with pytest.raises(openai.NotFoundError) as info:
            await client.models.retrieve("org/other-model")
        error = info.value.body
        assert (error["code"], error["param"]) == ("model_not_found", "model")
        assert "org/other-model" in error["message"] and MODEL in error["message"]

    serve(smollm2_tokenizer, [], test)


def test_unknown_paths_and_wrong_methods_say_what_the_server_has(smollm2_tokenizer):
    async def test(client, session, tm):
        async with session.get("/v1/audio/speech") as r:
            error = (await r.json())["error"]
        assert (r.status, error["type"], error["code"]) == (
            404,
            "invalid_request_error",
            "not_found",
        )
        assert "/v1/audio/speech" in error["message"]
        assert all(endpoint in error["message"] for endpoint in ENDPOINTS)
        async with session.post("/v1/models") as r:
            error = (await r.json())["error"]
        assert (r.status, error["type"]) == (405, "invalid_request_error")
        assert "POST is not allowed on /v1/models, which takes GET" in error["message"]
        assert all(endpoint in error["message"] for endpoint in ENDPOINTS)
        async with session.get("/v1/chat/completions") as r:
            assert r.status == 405
            assert "which takes POST" in (await r.json())["error"]["message"]
        async with session.get("/v1/messages/batches") as r:  # Anthropic's shape there
            body = await r.json()
        assert (r.status, body["type"], body["error"]["type"]) == (404, "error", "not_found_error")
        assert "/v1/messages/batches" in body["error"]["message"]

    serve(smollm2_tokenizer, [], test)


def test_aiohttp_errors_without_a_path_keep_their_reason():
    assert http_exception_error(web.HTTPNotFound()).message == "Not Found"
    error = http_exception_error(web.HTTPMethodNotAllowed("PUT", ["GET", "HEAD"]), "/x", ["GET /x"])
    assert (
        error.message
        == "PUT is not allowed on /x, which takes GET; this server's endpoints: GET /x"
    )


def _cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "radixserve.entrypoints.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


def test_version_and_help():
    from importlib import metadata

    assert _cli("--version").strip() == f"radixserve {metadata.version('radixserve')}"
    text = " ".join(_cli("--help").split())
    for command, purpose in [
        ("serve", "serve one model over HTTP"),
        ("router", "in front of many workers"),
        ("bench", "measure"),
    ]:
        assert f"{command} {purpose}" in text, command
