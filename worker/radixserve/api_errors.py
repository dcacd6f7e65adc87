"""OpenAI's error body, the one JSON shape every radixserve process answers errors with.

A leaf module (no radixserve imports, no torch) so that processes without the engine (the
router) return errors in the same shape as the worker: `{"error": {"message", "type", "param",
"code"}}`.
"""

from __future__ import annotations

from typing import Any


def error_body(
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
