"""What the router knows of each API it forwards: how its errors look, how its streams end.

Three stream shapes pass through the router, each relayed event by event, unchanged:

- OpenAI's chat and completions (and `/generate`): `data: {json}` events ending with
  `data: [DONE]`.
- Anthropic's Messages: `event: <type>` and `data: {json}`, ending with `message_stop` (or an
  `error` event); no `[DONE]`.
- OpenAI's Responses: `event: <type>` and `data: {json}` with a `sequence_number` counting the
  events from 0, ending with `response.completed`, `response.incomplete`, `response.failed` or
  `error`; no `[DONE]`. Its `response.created` event names the response being made.

A stream that ends without its last event (the worker died midway) gets the end its API's
clients understand (`StreamShape.broken`): OpenAI's error event and `[DONE]`, Anthropic's
`event: error` with an `api_error`, the Responses API's `error` event with the next sequence
number. Errors the router makes itself on `/v1/messages*` are in Anthropic's shape
(`anthropic_error_body`), as the worker's are.
"""

from __future__ import annotations

import json
from typing import Any

from radixserve.api_errors import error_body

MESSAGES_PATH = "/v1/messages"
RESPONSES_PATH = "/v1/responses"

# Anthropic's error types by HTTP status (the worker's frontend/anthropic/http.py: the router
# cannot import the front end)
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}
UPSTREAM_DISCONNECTED = "upstream_disconnected"


def is_anthropic_path(path: str) -> bool:
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def anthropic_error_body(message: str, status: int) -> dict[str, Any]:
    kind = ANTHROPIC_ERROR_TYPES.get(
        status, "api_error" if status >= 500 else "invalid_request_error"
    )
    return {"type": "error", "error": {"type": kind, "message": message}}


def as_anthropic_error(body: bytes, status: int) -> bytes | None:
    """An OpenAI-shaped error body in Anthropic's shape (the field it is about named in the
    message, as the worker does); None for a body that is not one."""
    try:
        error = json.loads(body)["error"]
        message, param = str(error["message"]), error.get("param")
    except (ValueError, UnicodeDecodeError, KeyError, TypeError):
        return None
    if param and param not in message:
        message = f"{param}: {message}"
    return json.dumps(anthropic_error_body(message, status)).encode()


def parse_event(block: bytes) -> tuple[bytes | None, bytes | None]:
    """An SSE event's `event:` name and its `data:` (lines joined), each None when absent."""
    name: bytes | None = None
    data: list[bytes] = []
    for line in block.split(b"\n"):
        field, _, value = line.rstrip(b"\r").partition(b":")
        value = value.removeprefix(b" ")
        if field == b"event":
            name = value
        elif field == b"data":
            data.append(value)
    return name, (b"\n".join(data) if data else None)


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()


class StreamShape:
    """One stream's API: `feed` each event as it passes, then `ended` says whether its last
    event came, and `broken` is what to end it with when it did not."""

    end_names: frozenset[bytes] = frozenset()
    last_event = "its last event"

    def __init__(self) -> None:
        self.ended = False
        self.response_id: str | None = None  # the Responses API's response, once announced

    def feed(self, block: bytes) -> None:
        name, data = parse_event(block)
        if data is not None:
            self.ended = self.ended or self._ends(name, data)

    def _ends(self, name: bytes | None, data: bytes) -> bool:
        return name in self.end_names

    def broken(self, message: str) -> bytes:
        raise NotImplementedError


class OpenAIStream(StreamShape):
    last_event = "data: [DONE]"

    def _ends(self, name: bytes | None, data: bytes) -> bool:
        return data.strip() == b"[DONE]"

    def broken(self, message: str) -> bytes:
        event = error_body(message, type="server_error", code=UPSTREAM_DISCONNECTED)
        return b"data: " + json.dumps(event).encode() + b"\n\ndata: [DONE]\n\n"


class AnthropicStream(StreamShape):
    end_names = frozenset({b"message_stop", b"error"})
    last_event = "message_stop"

    def broken(self, message: str) -> bytes:
        return _event("error", anthropic_error_body(message, 500))


class ResponsesStream(StreamShape):
    end_names = frozenset(
        {b"response.completed", b"response.incomplete", b"response.failed", b"error"}
    )
    last_event = "response.completed"

    def __init__(self) -> None:
        super().__init__()
        self.events = 0  # the next event's sequence_number

    def _ends(self, name: bytes | None, data: bytes) -> bool:
        self.events += 1
        if name == b"response.created" and self.response_id is None:
            try:
                response_id = json.loads(data)["response"]["id"]
            except (ValueError, UnicodeDecodeError, KeyError, TypeError):
                response_id = None
            self.response_id = response_id if isinstance(response_id, str) else None
        return name in self.end_names

    def broken(self, message: str) -> bytes:
        event = {
            "type": "error",
            "code": UPSTREAM_DISCONNECTED,
            "message": message,
            "param": None,
            "sequence_number": self.events,
        }
        return _event("error", event)


def stream_shape(path: str) -> StreamShape:
    if is_anthropic_path(path):
        return AnthropicStream()
    if path == RESPONSES_PATH:
        return ResponsesStream()
    return OpenAIStream()
