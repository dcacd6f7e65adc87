"""Responses affinity: a stored response lives on the worker that made it.

The Responses API keeps each response (and the conversation it answered) in the memory or
directory of the worker that made it, and that worker's prefix cache holds the conversation
too. So the router remembers which worker made each response (`ResponseAffinity`: id ->
worker URL, the least recently used forgotten beyond its capacity), learnt from the worker's
reply: the `id` of a whole response, the `response.created` event of a stream. A request
naming a response (`previous_response_id` in `POST /v1/responses`, or the id of
`GET`/`DELETE /v1/responses/{id}`) goes to that worker, whatever the policy would pick; when
that worker is gone or not ready the router answers 404 itself (`not_held`). An id the router
never saw is routed as usual: another router replica may have made it, and the worker that
gets it answers 404 itself when it does not hold it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass

from radixserve.api_errors import APIError

DEFAULT_CAPACITY = 100_000
RESPONSES_PATH = "/v1/responses"


class ResponseAffinity:
    """Response id -> the URL of the worker that made it; at most `capacity`, LRU."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._holders: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._holders)

    def remember(self, response_id: str, url: str) -> None:
        if self.capacity <= 0:
            return
        self._holders[response_id] = url
        self._holders.move_to_end(response_id)
        while len(self._holders) > self.capacity:
            self._holders.popitem(last=False)

    def holder(self, response_id: str) -> str | None:
        url = self._holders.get(response_id)
        if url is not None:
            self._holders.move_to_end(response_id)
        return url

    def forget(self, response_id: str) -> None:
        self._holders.pop(response_id, None)


@dataclass(frozen=True)
class ResponseRequest:
    """What a Responses API request means to the affinity."""

    named: str | None  # the stored response it needs: previous_response_id, or the path's id
    param: str | None  # where the request names it (None: in the path)
    creates: bool = False  # a POST that stores what it makes (`store` is not false)
    deletes: bool = False


def response_request(method: str, path: str, body: bytes) -> ResponseRequest | None:
    """The request's part in the affinity, or None for a request outside the Responses API."""
    if path == RESPONSES_PATH and method == "POST":
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
        if not isinstance(payload, dict):
            return None
        previous = payload.get("previous_response_id")
        return ResponseRequest(
            named=previous if isinstance(previous, str) else None,
            param="previous_response_id",
            creates=payload.get("store", True) is not False,
        )
    if path.startswith(RESPONSES_PATH + "/") and method in ("GET", "DELETE"):
        return ResponseRequest(
            named=path.removeprefix(RESPONSES_PATH + "/"), param=None, deletes=method == "DELETE"
        )
    return None


def not_held(response_id: str, param: str | None, why: str) -> APIError:
    return APIError(
        f"response {response_id!r} is not held by any ready worker: {why}",
        404,
        param=param,
        code="response_not_found",
    )
