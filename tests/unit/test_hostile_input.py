"""What a hostile client sends, checked in-process: every such input is a 400 (or 401) naming
what is wrong, never a 500, a RecursionError, an OverflowError or a forged log line.

The same inputs over a real server: tests/integration/test_server_hostile.py and the fuzz test
tests/integration/test_fuzz_api.py."""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from radixserve.api_errors import InvalidParameterError
from radixserve.api_keys import api_key_guard
from radixserve.catalog.constraint_kinds import (
    MAX_SCHEMA_DEPTH,
    json_depth,
    regex_problem,
    schema_features_problem,
    validate_constraint,
)
from radixserve.frontend.http_server import (
    _REQUEST_ID,
    REQUEST_ID_KEY,
    as_api_error,
    openai_errors,
    request_ids,
)
from radixserve.frontend.openai.protocol import (
    MAX_JSON_DEPTH,
    MAX_WARNED_FIELDS,
    OPENAI_PARAM_NAMES,
    ChatCompletionRequest,
    FieldPolicy,
    check_json_schema,
    decode_body,
    parse_request,
)
from radixserve.frontend.tokenizer_manager import NATIVE_PARAM_NAMES, TokenizerManager
from radixserve.logging_config import escape_control


def nested_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


# -- logs ------------------------------------------------------------------------------------


def test_escape_control_shows_every_control_character_as_an_escape():
    shown = escape_control("/v1/x\nFORGED line\x00\r\t\x1b[31m\x7f\x85\u2028\ud800\\n")
    assert shown == "/v1/x\\nFORGED line\\x00\\r\\t\\x1b[31m\\x7f\\x85\\u2028\\ud800\\\\n"
    assert shown.isprintable()
    assert escape_control("plain/path-1?a=b") == "plain/path-1?a=b"
    long = escape_control("x" * 10_000)
    assert len(long) == 515 and long.endswith("...")


def test_unknown_field_warnings_are_escaped_and_bounded(caplog):
    policy = FieldPolicy(strict=False)
    caplog.set_level(logging.WARNING)
    policy.check([("evil\nFORGED", "evil\nFORGED")])
    (record,) = caplog.records
    assert "\n" not in record.getMessage() and "evil\\nFORGED" in record.getMessage()
    policy.check([(f"f{i}", f"f{i}") for i in range(3 * MAX_WARNED_FIELDS)])
    assert len(caplog.records) == MAX_WARNED_FIELDS  # then no more, however many names come
    assert "no more will be" in caplog.records[-1].getMessage()


async def _raw_exchange(server: TestServer, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(request)
    await writer.drain()
    reply = await reader.read()
    writer.close()
    return reply


@pytest.mark.asyncio
async def test_an_unauthorized_path_cannot_forge_a_log_line_and_a_non_utf8_key_is_a_401(caplog):
    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"id": request[REQUEST_ID_KEY]})

    app = web.Application(
        middlewares=[
            request_ids,
            openai_errors,
            api_key_guard(
                "sk-k",
                "sk-k",
                lambda r: r[REQUEST_ID_KEY],
                logging.getLogger("radixserve.frontend.http_server"),
            ),
        ]
    )
    app.router.add_get("/{tail:.*}", ok)
    caplog.set_level(logging.INFO)
    async with TestServer(app) as server:
        forged = await _raw_exchange(
            server, b"GET /v1/x%0aFORGED%00 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
        )
        non_utf8 = await _raw_exchange(
            server,
            b"GET /v1/models HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer \xff\xfe\x80\r\n"
            b"Connection: close\r\n\r\n",
        )
        right = await _raw_exchange(
            server,
            b"GET /v1/models HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer sk-k\r\n"
            b"Connection: close\r\n\r\n",
        )
    assert forged.startswith(b"HTTP/1.1 401")
    assert non_utf8.startswith(b"HTTP/1.1 401") and b'"invalid_api_key"' in non_utf8
    assert right.startswith(b"HTTP/1.1 200")
    lines = [r.getMessage() for r in caplog.records if "API key" in r.getMessage()]
    assert any("/v1/x\\nFORGED\\x00" in line for line in lines), lines
    assert not any("\n" in line or "\x00" in line for line in lines)


def test_a_request_id_is_checked_whole():
    """`$` in a match would let an id end in a newline (aiohttp refuses raw control bytes in
    header values today; the check does not lean on that)."""
    assert _REQUEST_ID.fullmatch("abc-123_X.y") is not None
    for bad in ("abc\n", "a b", "abc\x00", ""):
        assert _REQUEST_ID.fullmatch(bad) is None


# -- bodies ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "param", "says"),
    [
        (b"[" * 100_000 + b"]" * 100_000, None, "levels deep"),
        (b'{"a": ' * (MAX_JSON_DEPTH + 1) + b"1" + b"}" * (MAX_JSON_DEPTH + 1), "a", "deep"),
        (b'{"temperature": NaN}', None, "NaN is not a JSON value"),
        (b'{"temperature": -Infinity}', None, "Infinity is not a JSON value"),
        (b'{"max_tokens": ' + b"9" * 5000 + b"}", None, "not valid JSON"),
        (b'{"prompt": "\xff"}', None, "not valid JSON"),
        (b'{"prompt": "a\\ud800b"}', "prompt", "lone surrogate"),
        (b'{"messages": [{"content": "\\udfff"}]}', "messages.0.content", "lone surrogate"),
        (b'{"stop": ["ok", "x\\udc00"]}', "stop.1", "lone surrogate"),
        (b'{"regex": "a\\ud800"}', "regex", "lone surrogate"),
        (b'{"metadata": {"\\ud800": 1}}', "metadata", "lone surrogate"),
        (b'{"a": "\\ud83d\\ude00\\uD83D"}', "a", "lone surrogate"),  # a pair, then a lone one
        (b'{"a": "\\uDE00\\ud83d"}', "a", "lone surrogate"),  # low before high: no pair
        ('{"a": "\\ud800"}'.encode("utf-16"), None, "not valid JSON"),  # UTF-8 only
    ],
)
def test_malformed_bodies_are_400s(raw, param, says):
    with pytest.raises(InvalidParameterError, match=says) as info:
        decode_body(raw)
    assert (info.value.status, info.value.param) == (400, param)


def test_well_formed_bodies_decode():
    body = {"prompt": "caf\u00e9 \U0001f600", "a": [[[1.5e308]]], "n": 2**63}
    assert decode_body(json.dumps(body).encode()) == body
    assert decode_body(b'{"a": "\\\\ud800 \\udbff\\udfff"}') == {"a": "\\ud800 \U0010ffff"}
    deep = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert json_depth(decode_body(deep)) == MAX_JSON_DEPTH


# -- schemas and regexes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        (nested_schema(200), "nests more than"),
        ({"$ref": "https://example.com/schema.json"}, "only references inside the schema"),
        ({"items": {"$ref": "other.json#/a"}}, "only references inside the schema"),
        ({"type": "string", "pattern": "^(?=a)a+$"}, "lookahead"),
        ({"properties": {"a": {"type": "string", "pattern": "(?<!x)y"}}}, "lookbehind"),
        ({"type": "string", "pattern": "(a)\\1"}, "backreference"),
        ({"patternProperties": {"^(?!x)": {}}}, "patternProperties key"),
    ],
)
def test_schemas_the_output_could_not_follow_are_400s_naming_the_schema(schema, says):
    param = "response_format.json_schema.schema"
    with pytest.raises(InvalidParameterError, match=says) as info:
        check_json_schema(schema, param)
    assert info.value.param == param
    # the native API's json_schema (a string) is checked the same way
    assert says in (validate_constraint("json_schema", json.dumps(schema)) or "")


@pytest.mark.parametrize(
    "schema",
    [
        nested_schema(MAX_SCHEMA_DEPTH // 2 - 1),
        {"$defs": {"a": {"type": "string"}}, "items": {"$ref": "#/$defs/a"}},
        {"properties": {"pattern": {"type": "string"}, "$ref": {"type": "integer"}}},
        {"const": {"$ref": "https://x", "pattern": "(?=x)"}},  # data, not schema keywords
        {"type": "string", "pattern": "^[a-z]+\\(?=?\\d{2,3}$"},  # escaped: no lookahead
    ],
)
def test_schemas_within_bounds_pass(schema):
    check_json_schema(schema, "p")
    assert schema_features_problem(schema) is None


@pytest.mark.parametrize(
    ("regex", "says"),
    [
        ("(?=a)b", "lookahead"),
        ("b(?!a)", "negative lookahead"),
        ("(?<=a)b", "lookbehind"),
        ("(?<!a)b", "lookbehind"),
        ("(x)\\1", "backreference"),
        ("(?P<w>x)(?P=w)", "backreference"),
        ("(x)?(?(1)a|b)", "conditional"),
        ("(" * 10_000 + ")" * 10_000, "this server can read"),
    ],
)
def test_regex_dialect(regex, says):
    assert says in (regex_problem(regex) or "")


@pytest.mark.parametrize("regex", ["[a-z]+@[a-z]+\\.com", "\\(?=", "[(?=]", "(a)(b)\\d{1,3}"])
def test_regex_dialect_accepts_what_only_looks_like_a_lookaround(regex):
    assert regex_problem(regex) is None


# -- error messages and capacity -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "param", "names", "renamed", "renamed_param"),
    [
        (
            "n must be in [1, 128], got 0",
            "n",
            NATIVE_PARAM_NAMES,
            "sampling_params.n must be in [1, 128], got 0",
            "sampling_params.n",
        ),
        (
            "top_k must be -1 or 0 (off) or in [1, 9], got 10",
            "top_k",
            NATIVE_PARAM_NAMES,
            "sampling_params.top_k must be -1 or 0 (off) or in [1, 9], got 10",
            "sampling_params.top_k",
        ),
        (
            "max_new_tokens must be in [0, 8], got 9",
            "max_new_tokens",
            OPENAI_PARAM_NAMES,
            "max_tokens must be in [0, 8], got 9",
            "max_tokens",
        ),
        (
            "min_new_tokens must be in [0, max_new_tokens=16], got 20",
            "min_new_tokens",
            OPENAI_PARAM_NAMES,
            "min_tokens must be in [0, max_tokens=16], got 20",
            "min_tokens",
        ),
        (
            "json_schema nests more than 64 levels deep",
            "json_schema",
            OPENAI_PARAM_NAMES,
            "response_format nests more than 64 levels deep",
            "response_format",
        ),
    ],
)
def test_renaming_replaces_whole_names_only(message, param, names, renamed, renamed_param):
    error = InvalidParameterError(message, param).renamed(names)
    assert (error.message, error.param) == (renamed, renamed_param)


@pytest.mark.parametrize(
    ("samples", "param"),
    [([1] * 17, "prompt"), ([4] * 5, "n"), ([2] * 17, "prompt"), ([17], "n")],
)
def test_a_request_larger_than_the_queue_is_a_400_naming_the_field(samples, param):
    tm = SimpleNamespace(max_queued_requests=16)
    with pytest.raises(InvalidParameterError, match="can never fit") as info:
        TokenizerManager.check_fan_out(tm, samples, "prompt", "n")  # type: ignore[arg-type]
    assert (info.value.status, info.value.param) == (400, param)
    TokenizerManager.check_fan_out(tm, [4] * 4, "prompt", "n")  # type: ignore[arg-type]


def test_a_recursion_error_is_the_clients_400():
    """A safety net: whatever library recurses on a client's deep input, the answer is a 400."""
    error = as_api_error(RecursionError("maximum recursion depth exceeded"))
    assert (error.status, error.type) == (400, "invalid_request_error")


def test_chat_template_kwargs_are_bounded():
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "chat_template_kwargs": {"x": json.loads("[" * 20 + "]" * 20)},
    }
    with pytest.raises(InvalidParameterError, match="levels deep") as info:
        parse_request(ChatCompletionRequest, body, FieldPolicy(strict=False))
    assert info.value.param == "chat_template_kwargs"


@pytest.mark.parametrize(("size", "status"), [(2 * 1024 * 1024, 400), (65 * 1024 * 1024, 413)])
def test_a_large_body_is_read_and_decoded_off_the_loop_and_bounded(smollm2_tokenizer, size, status):
    """Bodies over a megabyte are joined and decoded on a thread (aiohttp's own read copies
    them on the loop); over MAX_BODY_BYTES is a 413 in OpenAI's shape."""
    from scripted_server import serve

    body = json.dumps({"model": "smollm2-135m", "prompt": "x" * size, "max_tokens": 1})

    async def test(client, session, tm):
        async with session.post("/v1/completions", data=body.encode()) as response:
            error = (await response.json())["error"]
            assert response.status == status, error
            assert error["type"] == "invalid_request_error"

    serve(smollm2_tokenizer, [], test)
