"""The Messages API's HTTP side: its server-sent events and its error shape.

Errors on `/v1/messages*` are Anthropic's `{"type": "error", "error": {"type", "message"}}`:
`anthropic_errors` rewrites the OpenAI-shaped error replies every other middleware and handler
renders (keys, request ids, validation, aiohttp's own 404/405/413, engine failures), keeping
their status and headers, so one error path serves both APIs. The field a 400 is about is named
in the message (Anthropic's shape has no `param`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from radixserve.api_errors import APIError

PATH_PREFIX = "/v1/messages"

ERROR_TYPES = {
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


def is_anthropic_path(path: str) -> bool:
    return path == PATH_PREFIX or path.startswith(PATH_PREFIX + "/")


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """Anthropic's error JSON; a message that does not name its field gets it in front."""
    if param and param not in message:
        message = f"{param}: {message}"
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def api_error_body(error: APIError) -> dict[str, Any]:
    return error_body(error.message, error.status, error.param)


@web.middleware
async def anthropic_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    response = await handler(request)
    if (
        not is_anthropic_path(request.path)
        or response.status < 400
        or not isinstance(response, web.Response)
        or response.prepared
        or not isinstance(response.body, bytes)
    ):
        return response
    try:
        error = json.loads(response.body)["error"]
        message, param = str(error["message"]), error.get("param")
    except (ValueError, KeyError, TypeError):
        return response
    response.body = json.dumps(error_body(message, response.status, param)).encode()
    return response


def _event(payload: dict[str, Any]) -> bytes:
    return f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n".encode()


async def stream_events(
    request: web.Request,
    events: AsyncIterator[dict[str, Any]],
    as_api_error: Callable[[Exception], APIError],
) -> web.StreamResponse:
    """Each event as `event: <type>` and `data: <json>` (no [DONE]). A failure before the first
    event is an ordinary error reply; after it, an `error` event ends the stream."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    try:
        async with contextlib.aclosing(events):
            async for event in events:
                if not response.prepared:
                    await response.prepare(request)
                await response.write(_event(event))
    except ConnectionResetError:
        raise
    except Exception as exc:
        error = as_api_error(exc)
        if not response.prepared:
            raise error from None
        await response.write(_event(api_error_body(error)))
    await response.write_eof()
    return response
