"""Hypothesis drives the real HTTP server (the session's `api_server`: the bundled SmolLM2 on the
CPU, behind API keys) with requests whose every field is pushed to its type's extremes and
beyond: huge and negative integers, floats, NaN and Infinity literals, strings where numbers go,
lone surrogates, random nested JSON, unknown fields, malformed request ids.

Whatever comes in, the server answers with no 5xx (except the isolated internal-error path: a
500 whose message starts "internal error"), every error body is OpenAI's shape, every stream is
well-formed, and the server is alive afterwards. Generation is kept cheap: the strategies ask for
at most a few tokens unless a value is out of range anyway.
"""

from __future__ import annotations

import http.client
import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
# the whole run stays well under two minutes on two CPU cores
MAX_EXAMPLES = 150
INT_EXTREMES = [
    0,
    -1,
    1,
    2,
    2**15,
    2**31 - 1,
    2**31,
    2**32,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    -(2**31),
    -(2**63),
    -(2**63) - 1,
    10**30,
    -(10**30),
    10**400,
]
STRING_EXTREMES = [
    "",
    " ",
    "NaN",
    "Infinity",
    "-1",
    "1e308",
    "0x10",
    "\ud800",
    "a\udfffb",
    "\x00",
    "line\nFORGED",
    "\u2028",
    "(?=a)b",
    "(a)\\1",
    "[",
    "root ::= ",
    "x" * 300,
]


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(INT_EXTREMES),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(STRING_EXTREMES),
    st.text(max_size=12),
)


def json_values() -> st.SearchStrategy[Any]:
    """Random JSON: scalars at their extremes, nested a few levels."""
    return st.recursive(
        SCALARS,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    )


def either(valid: st.SearchStrategy[Any], *wild: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's values: in range half the time (so requests get generated), else anything."""
    return st.one_of(valid, st.one_of(*wild) if wild else json_values())


EXTREME_INT = st.sampled_from(INT_EXTREMES)
ANY_NUMBER = st.one_of(st.floats(allow_nan=True, allow_infinity=True), EXTREME_INT, json_values())
# a count (max_tokens, n, ...): small and cheap when valid, anything at all otherwise, but never
# null (a null max_tokens means "up to the context": minutes of CPU)
COUNT = either(st.integers(0, 3), EXTREME_INT, json_values().filter(lambda v: v is not None))
TOKEN_IDS = st.lists(either(st.integers(0, 49151), EXTREME_INT), max_size=4)
TEXT = st.one_of(st.text(max_size=16), st.sampled_from(STRING_EXTREMES))
SCHEMAS = st.sampled_from(
    [
        {"type": "object"},
        {"type": "string", "maxLength": 3},
        {"$ref": "https://example.com/s.json"},
        {"type": "string", "pattern": "^(?=a)a$"},
        {"type": "objekt"},
        {"minLength": 5, "maxLength": 1, "type": "string"},
        {"properties": {"a": {"$ref": "#/$defs/missing"}}},
    ]
)
RESPONSE_FORMAT = either(
    st.one_of(
        st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema"])}),
        st.fixed_dictionaries(
            {
                "type": st.just("json_schema"),
                "json_schema": st.fixed_dictionaries({"name": TEXT, "schema": SCHEMAS}),
            }
        ),
    )
)
SAMPLING = {
    "temperature": either(st.floats(0, 2), ANY_NUMBER),
    "top_p": either(st.floats(0.01, 1), ANY_NUMBER),
    "top_k": either(st.integers(-1, 49152), EXTREME_INT, st.integers(), json_values()),
    "min_p": either(st.floats(0, 1), ANY_NUMBER),
    "presence_penalty": either(st.floats(-2, 2), ANY_NUMBER),
    "frequency_penalty": either(st.floats(-2, 2), ANY_NUMBER),
    "repetition_penalty": either(st.floats(0.01, 2), ANY_NUMBER),
    "seed": either(st.integers(0, 2**64 - 1), EXTREME_INT, json_values()),
    "stop": either(st.lists(st.text(min_size=1, max_size=4), max_size=3), TEXT, json_values()),
    "stop_token_ids": either(st.lists(st.integers(0, 49151), max_size=3), TOKEN_IDS),
    "ignore_eos": either(st.booleans()),
    "skip_special_tokens": either(st.booleans()),
    "regex": either(st.just("[ab]{1,2}"), st.sampled_from(["(?<=a)b", "(", "a\ud800"])),
    "ebnf": either(st.just('root ::= "a"'), st.just("start ::= x")),
    "logit_bias": either(
        st.dictionaries(st.integers(0, 49151).map(str), st.floats(-100, 100), max_size=3),
        st.dictionaries(
            st.one_of(st.sampled_from(["49152", "-1", "1" * 40, " 5 "]), TEXT),
            ANY_NUMBER,
            max_size=3,
        ),
    ),
    "n": COUNT,
}
COMPLETIONS = {
    "model": either(st.just(MODEL), TEXT, json_values()),
    "prompt": either(
        st.one_of(st.text(min_size=1, max_size=16), st.lists(st.text(min_size=1), max_size=2)),
        TEXT,
        TOKEN_IDS,
        st.lists(TOKEN_IDS, max_size=2),
        json_values(),
    ),
    "max_tokens": COUNT,
    "min_tokens": COUNT,
    "logprobs": either(st.integers(0, 5), EXTREME_INT, json_values()),
    "echo": either(st.booleans()),
    "best_of": COUNT,
    "suffix": json_values(),
    "stream": either(st.booleans()),
    "stream_options": either(st.fixed_dictionaries({"include_usage": st.booleans()})),
    "response_format": RESPONSE_FORMAT,
    "user": json_values(),
    **SAMPLING,
}
MESSAGE = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]), "content": TEXT}
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("user"),
            "content": st.lists(
                st.fixed_dictionaries(
                    {"type": st.sampled_from(["text", "image_url", "refusal"]), "text": TEXT}
                ),
                max_size=2,
            ),
        }
    ),
    json_values(),
)
TOOL = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": st.sampled_from(["get_weather", "bad name", ""]), "parameters": SCHEMAS}
            ),
        }
    ),
    json_values(),
)
CHAT = {
    "model": COMPLETIONS["model"],
    "messages": either(st.lists(MESSAGE, min_size=1, max_size=3)),
    "max_tokens": COUNT,
    # wins over max_tokens (the base request's is 2): never null either
    "max_completion_tokens": COUNT,
    "min_tokens": COUNT,
    "logprobs": either(st.booleans()),
    "top_logprobs": either(st.integers(0, 20), EXTREME_INT, json_values()),
    "tools": either(st.lists(TOOL, max_size=2)),
    "tool_choice": either(
        st.sampled_from(["none", "auto", "required"]),
        st.just({"type": "function", "function": {"name": "get_weather"}}),
        json_values(),
    ),
    "parallel_tool_calls": either(st.booleans()),
    "chat_template_kwargs": either(st.just({"enable_thinking": False})),
    "stream": either(st.booleans()),
    "stream_options": COMPLETIONS["stream_options"],
    "response_format": RESPONSE_FORMAT,
    "modalities": either(st.just(["text"])),
    **SAMPLING,
}
NATIVE_SAMPLING = {
    "max_new_tokens": COUNT,
    "min_new_tokens": COUNT,
    "json_schema": either(SCHEMAS.map(json.dumps)),
    **SAMPLING,
}
NATIVE = {
    "text": either(st.text(min_size=1, max_size=16), TEXT, st.lists(TEXT, max_size=3)),
    "input_ids": either(st.lists(st.integers(0, 49151), min_size=1, max_size=4), TOKEN_IDS),
    "stream": either(st.booleans()),
    "return_logprob": either(st.booleans()),
    "top_logprobs_num": either(st.integers(0, 20), EXTREME_INT, json_values()),
    # sampling_params of a wrong type (a dict without max_new_tokens would mean 128 tokens)
    "sampling_params": st.one_of(SCALARS, st.lists(SCALARS, max_size=3)),
}
ENDPOINTS = {
    "/v1/completions": ({"model": MODEL, "prompt": "Hello", "max_tokens": 2}, COMPLETIONS),
    "/v1/chat/completions": (
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_completion_tokens": 2,
        },
        CHAT,
    ),
    "/generate": ({"text": "Hello", "sampling_params": {"max_new_tokens": 2}}, NATIVE),
}
UNKNOWN = st.dictionaries(st.sampled_from(["x_unknown", "foo", "\ud800k", "a\nb"]), json_values())


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    """(path, body bytes, extra headers): a valid base request with some fields pushed to the
    extremes, or now and then a body that is not a request at all."""
    path = draw(st.sampled_from(sorted(ENDPOINTS)))
    base, fields = ENDPOINTS[path]
    body: Any = json.loads(json.dumps(base))
    names = draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=3, unique=True))
    for name in names:
        body[name] = draw(fields[name])
    if path == "/generate":
        params = draw(st.lists(st.sampled_from(sorted(NATIVE_SAMPLING)), max_size=3, unique=True))
        if params and isinstance(body.get("sampling_params"), dict):
            for name in params:
                body["sampling_params"][name] = draw(NATIVE_SAMPLING[name])
        if draw(st.booleans()) and "input_ids" in names:
            body.pop("text", None)
    # Hypothesis favours 0 (and the first of a list): 0 is the common case of each mode
    mode = draw(st.integers(0, 99))
    if 70 <= mode < 80:
        body.update(draw(UNKNOWN))
    elif 80 <= mode < 88:
        body = draw(json_values())  # not a request object at all
    raw = json.dumps(body).encode()  # lone surrogates go out as JSON escapes ("\ud800")
    if mode >= 88:
        raw = draw(
            st.sampled_from(
                [raw[:-1], b"", b"{", b"[" * 5000, b'{"a": NaN}', b'{"a": 1e999}', b"\xff\xfe"]
            )
        )
    headers = {}
    if draw(st.integers(0, 9)) == 7:
        headers["X-Request-Id"] = draw(
            st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=300)
        )
    return path, raw, headers


def send(server, key: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        connection.request(
            "POST",
            path,
            body,
            {"Content-Type": "application/json", "Authorization": f"Bearer {key}", **headers},
        )
        reply = connection.getresponse()
        return reply.status, reply.read()
    finally:
        connection.close()


def check_error(error: Any, status: int | None) -> None:
    """OpenAI's error shape; a server error only from the isolated internal-error path."""
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and isinstance(error["type"], str), error
    assert error["param"] is None or isinstance(error["param"], str), error
    if status is None or status >= 500 or error["type"] == "server_error":
        assert error["message"].startswith("internal error"), (status, error)


def check_reply(status: int, raw: bytes) -> None:
    if status == 200 and raw.startswith(b"data: "):
        events = [e for e in raw.decode().split("\n\n") if e.strip()]
        assert events[-1] == "data: [DONE]", events[-3:]
        for event in events[:-1]:
            assert event.startswith("data: "), event
            payload = json.loads(event[len("data: ") :])
            if "error" in payload:
                check_error(payload["error"], None)
        return
    reply = json.loads(raw)
    if status < 400:
        assert isinstance(reply, dict | list), reply
        return
    assert status < 500 or (
        status == 500 and reply["error"]["message"].startswith("internal error")
    ), (
        status,
        reply,
    )
    check_error(reply["error"], status)


@pytest.fixture(scope="module")
def target(api_server, api_keys):
    return api_server, api_keys[0]


# what a hostile client sent before these limits, each a 500 or a dead scheduler: run every time
KNOWN = [
    ("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "top_k": 2**64}),
    ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2, "top_k": 2**63}}),
    ("/v1/completions", {"model": MODEL, "prompt": "a\ud800", "max_tokens": 2}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "\udc00"}]}),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 2, "regex": "\ud800"}),
    ("/generate", {"text": "Hi", "sampling_params": {"temperature": 10**400}}),
    ("/v1/completions", {"model": MODEL, "prompt": ["a"] * 2000, "max_tokens": 1}),
]


@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
@given(request=requests())
@example(request=("/v1/completions", b"[" * 100_000 + b"]" * 100_000, {}))
@example(request=("/generate", b'{"text": "' + b"1" * 5000 + b'"', {}))
@example(request=("/v1/completions", b'{"max_tokens": ' + b"9" * 4301 + b"}", {}))
@example(request=("/v1/completions", b'{"model": "x"}', {"X-Request-Id": "x" * 300}))
def test_no_request_gets_a_5xx_or_a_malformed_error(target, request):
    server, key = target
    path, body, headers = request
    status, raw = send(server, key, path, body, headers)
    event(f"{path} {status}")  # pytest --hypothesis-show-statistics shows the spread
    check_reply(status, raw)


@pytest.mark.parametrize(("path", "body"), KNOWN)
def test_known_hostile_requests(target, path, body):
    server, key = target
    status, raw = send(server, key, path, json.dumps(body).encode(), {})
    assert status == 400, raw
    check_reply(status, raw)


def test_the_server_is_alive_after_the_fuzzing(target, api_client):
    """Runs after the fuzz test (file order): probes and a normal request still work."""
    server, key = target
    started = time.monotonic()
    assert server.get("/health")[0] == 200
    assert server.get("/ready")[0] == 200
    reply = api_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3
    )
    assert reply.choices[0].message.role == "assistant"
    status, raw = send(
        server, key, "/generate", b'{"text": "Hi", "sampling_params": {"max_new_tokens": 2}}', {}
    )
    assert status == 200 and json.loads(raw)["meta_info"]["completion_tokens"] == 2
    assert time.monotonic() - started < 60
