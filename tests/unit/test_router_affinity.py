"""Responses affinity: the id -> worker map, which requests name a response, and the stream
shapes that end a broken stream in each API's own terms."""

from __future__ import annotations

import json

from radixserve.router.affinity import ResponseAffinity, ResponseRequest, response_request
from radixserve.router.apis import (
    AnthropicStream,
    OpenAIStream,
    ResponsesStream,
    as_anthropic_error,
    parse_event,
    stream_shape,
)


def test_the_map_is_a_bounded_lru() -> None:
    affinity = ResponseAffinity(capacity=2)
    affinity.remember("resp_a", "http://a")
    affinity.remember("resp_b", "http://b")
    assert affinity.holder("resp_a") == "http://a"  # now the most recently used
    affinity.remember("resp_c", "http://c")
    assert affinity.holder("resp_b") is None  # the least recently used went first
    assert (affinity.holder("resp_a"), affinity.holder("resp_c")) == ("http://a", "http://c")
    affinity.remember("resp_a", "http://z")  # a later answer wins
    assert affinity.holder("resp_a") == "http://z" and len(affinity) == 2
    affinity.forget("resp_a")
    affinity.forget("resp_unknown")
    assert affinity.holder("resp_a") is None and len(affinity) == 1
    off = ResponseAffinity(capacity=0)
    off.remember("resp_a", "http://a")
    assert off.holder("resp_a") is None


def test_which_requests_name_a_response() -> None:
    def of(method: str, path: str, body: object = None) -> ResponseRequest | None:
        return response_request(method, path, json.dumps(body).encode() if body else b"")

    assert of("POST", "/v1/responses", {"input": "hi"}) == ResponseRequest(
        None, "previous_response_id", creates=True
    )
    follow_up = of("POST", "/v1/responses", {"previous_response_id": "resp_1", "store": False})
    assert follow_up == ResponseRequest("resp_1", "previous_response_id", creates=False)
    assert of("GET", "/v1/responses/resp_1") == ResponseRequest("resp_1", None)
    assert of("DELETE", "/v1/responses/resp_1") == ResponseRequest("resp_1", None, deletes=True)
    assert of("POST", "/v1/responses", {"previous_response_id": 7}).named is None
    assert of("POST", "/v1/responses", ["not", "an", "object"]) is None
    assert response_request("POST", "/v1/responses", b"{broken") is None
    assert of("POST", "/v1/chat/completions", {"previous_response_id": "resp_1"}) is None


def test_sse_events_parse_with_and_without_names() -> None:
    assert parse_event(b'event: message_stop\ndata: {"type": "message_stop"}') == (
        b"message_stop",
        b'{"type": "message_stop"}',
    )
    assert parse_event(b"data: [DONE]") == (None, b"[DONE]")
    assert parse_event(b"data:a\ndata: b\r") == (None, b"a\nb")
    assert parse_event(b": a comment") == (None, None)


def feed(shape, *blocks: bytes):
    for block in blocks:
        shape.feed(block)
    return shape


def test_each_api_ends_its_stream_and_a_broken_one_in_its_own_terms() -> None:
    openai = feed(stream_shape("/v1/chat/completions"), b'data: {"i": 0}')
    assert isinstance(openai, OpenAIStream) and not openai.ended
    assert openai.broken("gone").endswith(b"\n\ndata: [DONE]\n\n")
    assert feed(openai, b"data: [DONE]").ended

    anthropic = feed(stream_shape("/v1/messages"), b"event: ping\ndata: {}")
    assert isinstance(anthropic, AnthropicStream) and not anthropic.ended
    name, data = parse_event(anthropic.broken("the worker stopped").strip())
    assert name == b"error" and b"[DONE]" not in anthropic.broken("x")
    assert json.loads(data or b"") == {
        "type": "error",
        "error": {"type": "api_error", "message": "the worker stopped"},
    }
    assert feed(anthropic, b"event: message_stop\ndata: {}").ended
    assert feed(AnthropicStream(), b"event: error\ndata: {}").ended  # the worker's own end

    created = {"type": "response.created", "response": {"id": "resp_1"}, "sequence_number": 0}
    responses = feed(
        stream_shape("/v1/responses"),
        b"event: response.created\ndata: " + json.dumps(created).encode(),
        b'event: response.output_text.delta\ndata: {"sequence_number": 1}',
    )
    assert isinstance(responses, ResponsesStream) and not responses.ended
    assert responses.response_id == "resp_1"
    name, data = parse_event(responses.broken("gone").strip())
    assert name == b"error"
    assert json.loads(data or b"") == {
        "type": "error",
        "code": "upstream_disconnected",
        "message": "gone",
        "param": None,
        "sequence_number": 2,
    }
    assert feed(responses, b"event: response.incomplete\ndata: {}").ended


def test_router_errors_on_the_messages_api_take_anthropics_shape() -> None:
    body = json.dumps({"error": {"message": "too deep", "param": "messages", "code": "x"}})
    assert json.loads(as_anthropic_error(body.encode(), 400) or b"") == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "messages: too deep"},
    }
    reshaped = as_anthropic_error(b'{"error": {"message": "busy"}}', 503)
    assert json.loads(reshaped or b"")["error"]["type"] == "overloaded_error"
    assert (
        json.loads(as_anthropic_error(b'{"error": {"message": "x"}}', 502) or b"")["error"]["type"]
        == "api_error"
    )
    assert as_anthropic_error(b'{"type": "error", "error": "?"}', 400) is None
