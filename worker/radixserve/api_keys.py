"""The API-key check the worker's front end and the router both run on every request: one
implementation, so the two servers accept the same headers the same way (torch-free leaf)."""

from __future__ import annotations

import hmac

from aiohttp import web


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
