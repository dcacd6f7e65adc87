"""Errors a client caused or must retry, in OpenAI's shape, for every process that answers HTTP.

A leaf module (no radixserve imports, no torch), so the lowest layers can raise a typed error
that already knows which request parameter is wrong, and the front end renders it as
`{"error": {"message", "type", "param", "code"}}` without parsing message text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web

# seconds a client is told to wait (Retry-After) before it tries an overloaded server again
RETRY_AFTER_S = 1


class APIError(Exception):
    """An error rendered as OpenAI's error JSON with an HTTP status (400 unless told)."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


class InvalidParameterError(APIError, ValueError):
    """A request parameter with a wrong type or value: a 400 naming it.

    A ValueError too, so in-process callers of the Engine catch it as they always did."""

    def __init__(self, message: str, param: str | None, code: str | None = None) -> None:
        super().__init__(message, param=param, code=code)

    def renamed(self, names: Mapping[str, str]) -> InvalidParameterError:
        """The same error in another API's vocabulary (max_new_tokens -> max_tokens)."""
        if self.param is None or self.param.split(".")[0] not in names:
            return self
        head, _, rest = self.param.partition(".")
        param = names[head] + ("." + rest if rest else "")
        # the parameter itself wherever the message names it, and any other field the message
        # cites as `name=value` (min_new_tokens must be in [0, max_new_tokens=16]); whole names
        # only, so the `n` inside "in" or "tokens" stays as written
        cited = sorted({head, *(k for k in names if k != head and f"{k}=" in self.message)})
        pattern = "|".join(re.escape(k) for k in sorted(cited, key=len, reverse=True))
        message = re.sub(
            rf"(?<![\w.])(?:{pattern})(?![\w])",
            lambda m: names[m.group()],
            self.message,
        )
        return InvalidParameterError(message, param=param, code=self.code)


def error_body(
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def http_exception_error(
    exc: web.HTTPException, path: str | None = None, endpoints: Sequence[str] = ()
) -> APIError:
    """One of aiohttp's own error replies (an unknown route, a wrong method, a body too large),
    as every server here answers it: in OpenAI's shape, `not_found` for a 404, a server error
    from 500 on. Given the request's path, a 404 names it and a 405 names the method and the
    ones the path takes; both then list the server's `endpoints` (`endpoints_of`)."""
    code = "not_found" if exc.status == 404 else None
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    message = exc.reason
    if path is not None and exc.status in (404, 405):
        if exc.status == 404:
            message = f"There is no endpoint {path}"
        else:
            allowed = sorted(set(getattr(exc, "allowed_methods", ())) - {"HEAD"})
            method = getattr(exc, "method", "this method")
            message = f"{method} is not allowed on {path}, which takes {', '.join(allowed)}"
        if endpoints:
            message += f"; this server's endpoints: {', '.join(endpoints)}"
    return APIError(message, status=exc.status, type=kind, code=code)


def endpoints_of(app: web.Application) -> list[str]:
    """`METHOD /path` for each route of an aiohttp app (the HEAD aiohttp adds to each GET, and
    catch-all routes, left out)."""
    return [
        f"{route.method} {route.resource.canonical}"
        for route in app.router.routes()
        if route.method not in ("HEAD", "*") and route.resource is not None
    ]


# The error's code, beside the body: a body reshaped for another API (Anthropic's has no code)
# still tells a router whether the worker refused the request or failed while running it.
ERROR_CODE_HEADER = "X-Radixserve-Error-Code"


def error_response(error: APIError) -> web.Response:
    """`error` as an HTTP reply: its JSON body, its status, its code in ERROR_CODE_HEADER, and
    Retry-After when it has one (aiohttp imported here: the layers that only raise never load
    it)."""
    from aiohttp import web

    headers = {}
    if error.retry_after is not None:
        headers["Retry-After"] = str(error.retry_after)
    if error.code is not None:
        headers[ERROR_CODE_HEADER] = error.code
    return web.json_response(error.body(), status=error.status, headers=headers)
