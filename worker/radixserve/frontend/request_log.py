"""`--log-requests`: one log line per finished generation request, and quiet client disconnects.

The `request_lifecycle` middleware wraps every handler. For the generation endpoints it gives
the request a `RequestRecord` that the handlers feed as chunks pass (`observe`,
`observe_native`),
and when the handler is done it writes one line on the `radixserve.requests` logger: the
response id, model, prompt, completion and cached tokens, finish reason, time to first token,
end-to-end latency and HTTP status (with `--log-format json` these are also the line's fields).
A client that goes away mid-request is one debug line and status 499 (the client closed the
request), not aiohttp's "Error handling request" traceback. What the client chose (its method
and path) is logged through `escape_control`: control characters show as escapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from radixserve.frontend.tokenizer_manager import GenerateChunk
from radixserve.logging_config import escape_control

logger = logging.getLogger(__name__)
request_logger = logging.getLogger("radixserve.requests")

GENERATION_PATHS = frozenset(
    {"/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses", "/generate"}
)
# an embedding or rerank request's line: its prompt tokens, no completion, finish "stop"
POOLING_PATHS = frozenset({"/v1/embeddings", "/v1/rerank", "/v1/score"})
CLIENT_CLOSED_REQUEST = 499
LOG_REQUESTS_KEY = web.AppKey("log_requests", bool)
MODEL_NAME_KEY = web.AppKey("model_name", str)


@dataclass
class _Choice:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None


@dataclass
class RequestRecord:
    """What one generation request did, filled by its handler as the output passes."""

    model: str
    path: str
    started: float = field(default_factory=time.perf_counter)
    id: str | None = None
    samples_per_prompt: int = 1
    first_token_at: float | None = None
    choices: dict[int, _Choice] = field(default_factory=dict)

    def observe(self, index: int, chunk: GenerateChunk) -> None:
        if chunk.token_ids and self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        reason = chunk.finish_reason["type"] if chunk.finish_reason else None
        self.choices[index] = _Choice(
            chunk.prompt_tokens, chunk.completion_tokens, chunk.cached_tokens, reason
        )

    def observe_native(self, index: int, item: dict[str, Any], streamed: bool) -> None:
        """A native (/generate) result or stream item: its meta_info has the counts."""
        meta = item["meta_info"]
        if streamed and item["output_ids"] and self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        elif not streamed and meta.get("time_to_first_token") is not None:
            first = self.started + meta["time_to_first_token"]
            self.first_token_at = min(first, self.first_token_at or first)
        reason = (meta.get("finish_reason") or {}).get("type")
        self.choices[index] = _Choice(
            meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"], reason
        )

    async def observed_native(
        self, items: AsyncIterator[dict[str, Any]]
    ) -> AsyncIterator[dict[str, Any]]:
        """A native stream, each item shown to this record; closing this closes `items`."""
        async with contextlib.aclosing(items):
            async for item in items:
                self.observe_native(0, item, streamed=True)
                yield item

    def fields(self, status: int) -> dict[str, Any]:
        prompts = {i // self.samples_per_prompt: c for i, c in sorted(self.choices.items())}
        reasons = sorted({c.finish_reason for c in self.choices.values() if c.finish_reason})
        now = time.perf_counter()
        return {
            "id": self.id or "-",
            "model": self.model,
            "path": self.path,
            "status": status,
            "prompt_tokens": sum(c.prompt_tokens for c in prompts.values()),
            "completion_tokens": sum(c.completion_tokens for c in self.choices.values()),
            "cached_tokens": sum(c.cached_tokens for c in prompts.values()),
            "finish_reason": ",".join(reasons) or "-",
            "ttft_s": None
            if self.first_token_at is None
            else round(self.first_token_at - self.started, 4),
            "e2e_s": round(now - self.started, 4),
        }


RECORD_KEY = web.RequestKey("request_record", RequestRecord)


def _log_disconnect(request: web.Request) -> None:
    # method and path are the client's: escaped, so they cannot forge a line
    logger.debug(
        "client disconnected: %s %s", escape_control(request.method), escape_control(request.path)
    )


def record_of(request: web.Request) -> RequestRecord | None:
    return request.get(RECORD_KEY)


@web.middleware
async def request_lifecycle(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    record = None
    logged = request.path in GENERATION_PATHS or request.path in POOLING_PATHS
    if request.app[LOG_REQUESTS_KEY] and logged:
        record = RequestRecord(model=request.app[MODEL_NAME_KEY], path=request.path)
        request[RECORD_KEY] = record
    status = CLIENT_CLOSED_REQUEST
    try:
        response = await handler(request)
        status = response.status
        return response
    except ConnectionResetError:
        # The client went away while the response was being written: nobody to answer.
        _log_disconnect(request)
        return web.Response(status=CLIENT_CLOSED_REQUEST)
    except asyncio.CancelledError:
        # aiohttp cancels the handler of a client that disconnects (or at shutdown).
        _log_disconnect(request)
        raise
    except web.HTTPException as exc:
        status = exc.status
        raise
    except Exception:
        status = 500
        raise
    finally:
        if record is not None:
            fields = record.fields(status)
            line = " ".join(f"{k}={'-' if v is None else v}" for k, v in fields.items())
            request_logger.info("request %s", line, extra=fields)
