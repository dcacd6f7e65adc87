"""The Responses API's server-sent events: `event: <type>` and `data: <json>` lines, no
`[DONE]` (its last event is `response.completed`, `response.incomplete` or `error`)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from radixserve.api_errors import APIError, error_response
from radixserve.frontend.tokenizer_manager import (
    GenerationError,
    RequestAbortedError,
    SchedulerUnavailableError,
)

# what a stream may fail with once it runs, answered as an error (an event after the first)
STREAM_FAILURES = (APIError, SchedulerUnavailableError, RequestAbortedError, GenerationError)


async def write_events(
    request: web.Request,
    events: AsyncIterator[dict[str, Any]],
    error_event: Callable[[APIError], dict[str, Any]],
    as_api_error: Callable[[Exception], APIError],
) -> web.StreamResponse:
    """Send `events`; a failure before the first is an ordinary error reply, after it an
    `error` event (`error_event`) that ends the stream."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )

    async def send(event: dict[str, Any]) -> None:
        if not response.prepared:
            await response.prepare(request)
        await response.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())

    try:
        async with contextlib.aclosing(events):
            async for event in events:
                await send(event)
    except STREAM_FAILURES as exc:
        error = as_api_error(exc)
        if not response.prepared:
            return error_response(error)
        await send(error_event(error))
    await response.write_eof()
    return response
