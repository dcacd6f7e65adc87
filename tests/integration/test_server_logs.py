"""Worker logs over a real server: --log-requests lines, --log-format json for every process,
and client disconnects as one debug line each instead of aiohttp tracebacks."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from radixserve.bench.server_process import ServerProcess

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m"
DROPPED_STREAMS = 6
WAIT_S = 120.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    log = tmp_path_factory.mktemp("server") / "server.log"
    flags = ["--max-total-tokens", "4096", "--log-requests", "--log-format", "json"]
    process = ServerProcess([*flags, "--log-level", "debug"], log_path=log)
    with process:
        yield process, log


def records(log: Path) -> list[dict]:
    """Every line of the log, each of which must be one JSON object."""
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    return [json.loads(line) for line in lines]


def wait_for_records(log: Path, predicate, count: int) -> list[dict]:
    deadline = time.monotonic() + WAIT_S
    while True:
        found = [r for r in records(log) if predicate(r)]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def request_lines(log: Path, count: int) -> list[dict]:
    return wait_for_records(log, lambda r: r["logger"] == "radixserve.requests", count)


def test_each_finished_request_is_one_line_with_its_numbers(server) -> None:
    process, log = server
    client = OpenAI(base_url=process.base_url + "/v1", api_key="none")
    before = len(request_lines(log, 0))
    completion = client.completions.create(
        model=MODEL,
        prompt="The capital of France is",
        max_tokens=8,
        temperature=0,
        extra_headers={"X-Request-Id": "log-plain"},
    )
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"X-Request-Id": "log-streamed"},
        )
    )
    status, body = process.get("/v1/models")
    assert status == 200  # not a generation request: no line
    with pytest.raises(Exception, match="does not exist"):
        client.completions.create(model="nope", prompt="x", max_tokens=1)
    lines = request_lines(log, before + 3)[before:]
    assert len(lines) == 3, lines
    plain, streamed, missing = lines
    usage = completion.usage
    # a line carries the request id (the client's X-Request-Id), which the response id holds
    assert plain["id"] == "log-plain" and completion.id == "cmpl-log-plain"
    assert plain["model"] == MODEL
    assert plain["path"] == "/v1/completions" and plain["status"] == 200
    assert (plain["prompt_tokens"], plain["completion_tokens"], plain["cached_tokens"]) == (
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.prompt_tokens_details.cached_tokens,
    )
    assert plain["finish_reason"] == "length"
    assert 0 < plain["ttft_s"] <= plain["e2e_s"]
    assert plain["message"].startswith(f"request id=log-plain model={MODEL} ")
    assert streamed["id"] == "log-streamed" and chunks[0].id == "chatcmpl-log-streamed"
    assert streamed["status"] == 200
    assert streamed["completion_tokens"] == chunks[-1].usage.completion_tokens
    assert streamed["finish_reason"] in {"stop", "length"}
    assert 0 < streamed["ttft_s"] <= streamed["e2e_s"]
    assert missing["status"] == 404 and missing["completion_tokens"] == 0
    assert missing["ttft_s"] is None


def test_native_generate_is_logged_too(server) -> None:
    process, log = server
    before = len(request_lines(log, 0))
    connection = http.client.HTTPConnection("127.0.0.1", process.port, timeout=120)
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    connection.request("POST", "/generate", json.dumps(body), {"X-Request-Id": "log-native"})
    result = json.loads(connection.getresponse().read())
    (line,) = request_lines(log, before + 1)[before:]
    meta = result["meta_info"]
    assert line["id"] == "log-native" and line["path"] == "/generate"
    assert line["completion_tokens"] == meta["completion_tokens"] == 4
    assert 0 < line["ttft_s"] <= line["e2e_s"] and meta["time_to_first_token"] > 0


def test_dropped_streams_are_one_debug_line_each(server) -> None:
    process, log = server
    before = len(request_lines(log, 0))
    body = {
        "model": MODEL,
        "prompt": "Count to one hundred:",
        "max_tokens": 200,
        "stream": True,
        "ignore_eos": True,
    }
    for _ in range(DROPPED_STREAMS):
        connection = http.client.HTTPConnection("127.0.0.1", process.port, timeout=120)
        connection.request("POST", "/v1/completions", json.dumps(body))
        reply = connection.getresponse()
        assert reply.status == 200
        assert reply.read(6) == b"data: "  # the stream is flowing: drop it
        connection.sock.close()
        reply.close()
    dropped = request_lines(log, before + DROPPED_STREAMS)[before:]
    assert [line["status"] for line in dropped] == [499] * DROPPED_STREAMS
    notes = [r for r in records(log) if r["message"].startswith("client disconnected")]
    assert len(notes) == DROPPED_STREAMS
    assert all(r["level"] == "DEBUG" and "exc_info" not in r for r in notes)
    assert not [r for r in records(log) if "Error handling request" in r["message"]]
    assert process.get("/health")[0] == 200  # and the server carries on


def test_every_log_line_of_every_process_is_json(server) -> None:
    _, log = server
    lines = records(log)
    assert all({"time", "level", "logger", "process", "message"} <= set(r) for r in lines)
    processes = {r["process"] for r in lines}
    assert {"frontend", "scheduler"} <= processes, processes
    assert any("serving" in r["message"] for r in lines if r["process"] == "frontend")
