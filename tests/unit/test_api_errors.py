"""aiohttp's own error replies in OpenAI's shape, the same from the worker and the router."""

from __future__ import annotations

from aiohttp import web

from radixserve.api_errors import http_exception_error


def test_aiohttp_errors_keep_their_status_and_say_whose_fault():
    missing = http_exception_error(web.HTTPNotFound())
    assert (missing.status, missing.type, missing.code) == (
        404,
        "invalid_request_error",
        "not_found",
    )
    assert missing.body()["error"]["message"] == "Not Found"
    wrong_method = http_exception_error(web.HTTPMethodNotAllowed("GET", ["POST"]))
    assert (wrong_method.status, wrong_method.type, wrong_method.code) == (
        405,
        "invalid_request_error",
        None,
    )
    too_large = http_exception_error(web.HTTPRequestEntityTooLarge(10, 20))
    assert (too_large.status, too_large.type) == (413, "invalid_request_error")
    broken = http_exception_error(web.HTTPServiceUnavailable())
    assert (broken.status, broken.type) == (503, "server_error")
