"""aiohttp's own error replies in OpenAI's shape, the same from the worker and the router."""

from __future__ import annotations

from aiohttp import web

from radixserve.api_errors import ERROR_CODE_HEADER, APIError, error_response, http_exception_error


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


def test_an_error_reply_carries_its_code_in_a_header_whatever_its_body_becomes():
    """The router reads it to tell a refusal (draining) from a failure (unavailable), also on
    the Anthropic API, whose error body has no code."""

    reply = error_response(APIError("shutting down", status=503, code="draining", retry_after=1))
    assert reply.headers[ERROR_CODE_HEADER] == "draining"
    assert reply.headers["Retry-After"] == "1"
    assert ERROR_CODE_HEADER not in error_response(APIError("no code", status=500)).headers
