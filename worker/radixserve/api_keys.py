"""The API-key check the worker's front end and the router both run before any handler: one
implementation, so the two servers guard the same paths, accept the same headers and refuse
the same way (torch-free leaf, below the router and the front end)."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from radixserve.api_errors import APIError, error_response
from radixserve.logging_config import escape_control

# the probes and metrics stay open; the admin paths take the admin key
OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})
ADMIN_PATHS = frozenset(
    {"/flush_cache", "/get_server_info", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"}
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def key_matches(request: web.Request, key: str) -> bool:
    """Whether `Authorization: Bearer KEY` or `x-api-key: KEY` carries the key. Compared in
    constant time; header bytes that are not UTF-8 arrive as surrogate escapes and are compared
    as the bytes sent (a 401, never an encoding error)."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    sent = [token] if scheme.lower() == "bearer" else []
    if "x-api-key" in request.headers:
        sent.append(request.headers["x-api-key"])
    return any(
        hmac.compare_digest(s.strip().encode("utf-8", "surrogateescape"), key.encode())
        for s in sent
    )


def invalid_api_key() -> web.Response:
    """The 401 for a missing or wrong key, in OpenAI's shape."""
    refusal = error_response(
        APIError(
            "Incorrect API key provided: send it as 'Authorization: Bearer <key>' or"
            " 'x-api-key: <key>'",
            status=401,
            code="invalid_api_key",
        )
    )
    refusal.headers["WWW-Authenticate"] = "Bearer"
    return refusal


def api_key_guard(
    api_key: str | None,
    admin_key: str | None,
    request_id: Callable[[web.Request], str],
    log: logging.Logger,
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """A middleware that asks for `api_key` (or `admin_key` on the admin paths; none on the
    probes) before any handler runs, so before any side effect. A refusal is logged on the
    server's own `log`, with `request_id` naming the request."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        key = None if path in OPEN_PATHS else admin_key if path in ADMIN_PATHS else api_key
        if key is not None and not key_matches(request, key):
            log.info(
                "request %s to %s: missing or wrong API key",
                escape_control(request_id(request), 128),
                escape_control(path),
            )
            return invalid_api_key()
        return await handler(request)

    return guard
