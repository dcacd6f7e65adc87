"""What a hostile client sends, against the real server (the session's `api_server`: the bundled
SmolLM2 behind API keys): each input is a 400 naming the field (or a 401), never a 500, the
server keeps serving, and nothing the client chose forges a log line.

Malformed bodies go out as raw bytes (no client library would send them); what applications
send goes through the official `openai` client."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path

import openai
import pytest

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
VOCAB = 49152  # SmolLM2's
CHAT = [{"role": "user", "content": "Hi"}]


def raw_request(
    server, method: str, path: str, body: bytes | None, headers: dict[str, str | bytes]
) -> tuple[int, dict]:
    """(status, JSON reply) of one request whose bytes are sent as given."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        for name, value in {"Content-Type": "application/json", **headers}.items():
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        reply = connection.getresponse()
        return reply.status, json.loads(reply.read() or b"null")
    finally:
        connection.close()


@pytest.fixture(scope="module")
def post(api_server, api_keys):
    key = api_keys[0]

    def send(path: str, body: dict | bytes, headers: dict | None = None) -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        auth = {"Authorization": f"Bearer {key}"}
        return raw_request(api_server, "POST", path, data, {**auth, **(headers or {})})

    return send


def assert_400(reply: tuple[int, dict], param: str | None, says: str = "") -> str:
    status, body = reply
    assert status == 400, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"]) == ("invalid_request_error", param), error
    assert says in error["message"], error
    return error["message"]


def assert_serving(api_client) -> None:
    reply = api_client.completions.create(model=MODEL, prompt="Hello", max_tokens=2)
    assert reply.choices[0].finish_reason in ("length", "stop")


# ------------------------------------------------------------------ A: numbers at their extremes


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("top_k", 2**64, "top_k"),  # overflowed an int64 tensor and killed the scheduler
        ("top_k", 2**63, "top_k"),
        ("top_k", VOCAB + 1, "top_k"),
        ("max_tokens", 2**64, "max_tokens"),
        ("max_tokens", 10**9, "max_tokens"),
        ("min_tokens", 2**63, "min_tokens"),
        ("n", 2**63, "n"),
        ("n", True, "n"),
        ("seed", 2**64, "seed"),
        ("seed", -1, "seed"),
        ("seed", 1.5, "seed"),
        ("stop_token_ids", [2**63], "stop_token_ids"),
        ("stop_token_ids", [VOCAB], "stop_token_ids"),
        ("logit_bias", {str(2**64): 1}, "logit_bias"),
        ("logit_bias", {"5": 1e308}, "logit_bias"),
        ("logprobs", 2**63, "logprobs"),
        ("temperature", 1e308, "temperature"),
        ("temperature", 10**400, "temperature"),
        ("top_p", True, "top_p"),
        ("min_p", 10**400, "min_p"),
        ("repetition_penalty", -1e-300, "repetition_penalty"),
        ("frequency_penalty", 2**70, "frequency_penalty"),
    ],
)
def test_extreme_numbers_are_400s_naming_the_field(post, field, value, param):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, field: value}
    assert_400(post("/v1/completions", body), param)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_k", 2**64),
        ("max_new_tokens", 2**63),
        ("min_new_tokens", -(2**63)),
        ("n", 2**64),
        ("temperature", 10**400),
        ("stop_token_ids", [-(2**63) - 1]),
        ("logit_bias", {"1" * 100: 1}),
        ("logit_bias", {"5": 10**400}),
    ],
)
def test_native_extreme_numbers_are_400s_naming_the_field(post, field, value):
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 2, field: value}}
    assert_400(post("/generate", body), f"sampling_params.{field}")


def test_top_logprobs_and_nan_literals_are_refused(post, api_client):
    chat = {"model": MODEL, "messages": CHAT, "max_tokens": 2, "logprobs": True}
    assert_400(post("/v1/chat/completions", {**chat, "top_logprobs": 2**63}), "top_logprobs")
    assert_400(post("/generate", {"text": "Hi", "top_logprobs_num": 2**63}), "top_logprobs_num")
    nan = b'{"model": "%s", "prompt": "Hi", "temperature": NaN}' % MODEL.encode()
    assert_400(post("/v1/completions", nan), None, "NaN is not a JSON value")
    with pytest.raises(openai.BadRequestError) as info:
        api_client.completions.create(
            model=MODEL, prompt="Hi", max_tokens=2, extra_body={"top_k": 2**64}
        )
    assert info.value.body["param"] == "top_k"
    assert_serving(api_client)


# ------------------------------------------------------------------ B: 400s, not 500s


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", b'{"model": "M", "prompt": "a\\ud800b", "max_tokens": 2}', "prompt"),
        (
            "/v1/chat/completions",
            b'{"model": "M", "messages": [{"role": "user", "content": "\\udfff"}]}',
            "messages.0.content",
        ),
        (
            "/v1/completions",
            b'{"model": "M", "prompt": "a", "stop": ["ok", "\\udc00"], "max_tokens": 2}',
            "stop.1",
        ),
        ("/v1/completions", b'{"model": "M", "prompt": "a", "regex": "a\\ud800"}', "regex"),
        ("/generate", b'{"text": "a\\ud800", "sampling_params": {"max_new_tokens": 2}}', "text"),
        (
            "/generate",
            b'{"text": "a", "sampling_params": {"regex": "\\ud800+"}}',
            "sampling_params.regex",
        ),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(post, path, body, param):
    assert_400(post(path, body.replace(b'"M"', f'"{MODEL}"'.encode())), param, "surrogate")


def nested_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def test_deep_json_is_a_400(post, api_client):
    assert_400(post("/v1/completions", b"[" * 100_000 + b"]" * 100_000), None, "levels deep")
    assert_400(post("/v1/chat/completions", b'{"messages": ' + b"[" * 100_000), None)
    deep = nested_schema(200)
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": deep}}
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 2, "response_format": response_format}
    assert_400(post("/v1/chat/completions", body), "response_format.json_schema.schema", "deep")
    native = {"text": "Hi", "sampling_params": {"json_schema": json.dumps(deep)}}
    assert_400(post("/generate", native), "sampling_params.json_schema", "deep")
    kwargs = {"x": nested_schema(300)}  # the template renderer recursed on them: a 500
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 2, "chat_template_kwargs": kwargs}
    assert_400(post("/v1/chat/completions", body), "chat_template_kwargs", "deep")
    with pytest.raises(openai.BadRequestError) as info:
        api_client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=2, response_format=response_format
        )
    assert info.value.body["param"] == "response_format.json_schema.schema"
    assert_serving(api_client)


def test_a_non_utf8_api_key_is_a_401(api_server, api_client):
    for value in (b"Bearer \xff\xfe\x80", b"\xc3\x28 \xa0\xa1"):
        status, body = raw_request(
            api_server, "POST", "/v1/completions", b"{}", {"Authorization": value}
        )
        assert (status, body["error"]["code"]) == (401, "invalid_api_key")
    assert_serving(api_client)


# ------------------------------------------------------------------ C: never fits the queue


def test_a_request_larger_than_the_queue_is_a_400_not_a_429(post):
    """The queue holds --max-queued-requests (1024 here): a 429 would invite retries forever."""
    many = {"model": MODEL, "prompt": ["a"] * 2000, "max_tokens": 1}
    assert_400(post("/v1/completions", many), "prompt", "can never fit")
    fanned = {"model": MODEL, "prompt": ["a"] * 9, "n": 128, "max_tokens": 1}
    assert_400(post("/v1/completions", fanned), "n", "can never fit")
    native = {"text": ["a"] * 1025, "sampling_params": {"max_new_tokens": 1}}
    assert_400(post("/generate", native), "text", "can never fit")
    native_n = {"text": ["a"] * 9, "sampling_params": {"max_new_tokens": 1, "n": 128}}
    assert_400(post("/generate", native_n), "sampling_params.n", "can never fit")


# ------------------------------------------------------------------ D: messages as written


def test_renamed_parameters_read_as_written(post, api_client):
    native = {"text": "Hi", "sampling_params": {"max_new_tokens": 2, "n": 0}}
    message = assert_400(post("/generate", native), "sampling_params.n")
    assert message == "sampling_params.n must be in [1, 128], got 0"
    native["sampling_params"] = {"max_new_tokens": 2, "top_k": -5}
    message = assert_400(post("/generate", native), "sampling_params.top_k")
    assert message == (
        f"sampling_params.top_k must be -1 or 0 (off) or in [1, {VOCAB}] (the vocabulary "
        "size), got -5"
    )
    native["sampling_params"] = {"max_new_tokens": 2, "min_new_tokens": 3}
    message = assert_400(post("/generate", native), "sampling_params.min_new_tokens")
    assert message == (
        "sampling_params.min_new_tokens must be in [0, sampling_params.max_new_tokens=2], got 3"
    )
    with pytest.raises(openai.BadRequestError) as info:
        api_client.completions.create(
            model=MODEL, prompt="Hi", max_tokens=2, extra_body={"min_tokens": 3}
        )
    assert info.value.body["param"] == "min_tokens"
    assert info.value.body["message"] == "min_tokens must be in [0, max_tokens=2], got 3"
    with pytest.raises(openai.BadRequestError) as info:
        api_client.completions.create(model=MODEL, prompt="Hi", max_tokens=10**9)
    assert info.value.body["param"] == "max_tokens"
    assert info.value.body["message"].startswith("max_tokens must be in [0, ")


# ------------------------------------------------------------------ E: schemas it cannot follow


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"$ref": "https://example.com/schema.json"}, "only references inside the schema"),
        (
            {"type": "object", "properties": {"a": {"$ref": "other.json"}}},
            "only references inside the schema",
        ),
        ({"type": "string", "pattern": "^(?=a)a+$"}, "lookahead"),
        ({"type": "string", "pattern": "^(a)\\1$"}, "backreference"),
        ({"type": "object", "patternProperties": {"^(?!x)": {}}}, "patternProperties"),
    ],
)
def test_schemas_the_output_could_not_follow_are_refused(post, api_client, schema, says):
    with pytest.raises(openai.BadRequestError) as info:
        api_client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=2,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        )
    assert info.value.body["param"] == "response_format.json_schema.schema"
    assert says in info.value.body["message"]
    native = {"text": "Hi", "sampling_params": {"max_new_tokens": 2}}
    native["sampling_params"]["json_schema"] = json.dumps(schema)
    assert_400(post("/generate", native), "sampling_params.json_schema", says)


def test_a_lookahead_is_refused_alike_in_regex_and_in_a_schema_pattern(post):
    regex = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "regex": "(?<=a)b"}
    assert_400(post("/v1/completions", regex), "regex", "lookbehind")


# ------------------------------------------------------------------ F: logs


def test_client_text_cannot_forge_a_log_line(api_server, tmp_path_factory):
    (log,) = tmp_path_factory.getbasetemp().glob("api_server[0-9]*/server.log")
    status, body = raw_request(api_server, "GET", "/v1/x%0aFORGED%20line%00end", None, {})
    assert (status, body["error"]["code"]) == (401, "invalid_api_key")
    status, body = raw_request(api_server, "GET", "/health", None, {"X-Request-Id": "x" * 300})
    assert (status, body["error"]["code"]) == (400, "invalid_request_id")
    deadline = time.monotonic() + 10
    while b"x\\nFORGED line\\x00end" not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.1)
    text = log.read_bytes()
    assert b"/v1/x\\nFORGED line\\x00end: missing or wrong API key" in text
    assert b"\x00" not in text
    assert not [line for line in text.splitlines() if line.startswith(b"FORGED")]
    assert Path(log).stat().st_size > 0
