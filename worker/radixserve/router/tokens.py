"""A request's prompt as the worker's token ids, for `--prefix-source events`.

The router has no tokenizer or chat template; the workers do, and their `POST /tokenize`
renders a chat (messages, tools, template arguments) or tokenizes a completion prompt exactly as
generation will, so the block hashes the router computes are the ones the worker publishes.
Token ids the client sent (`/generate`'s `input_ids`, a completion's id list) are used as they
are. Anything else (other APIs, a failed call) gives None: the policy then falls back to its
approximate tree for that request.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

logger = logging.getLogger(__name__)

TOKENIZE_TIMEOUT_S = 5.0


def _ids(value: Any) -> list[int] | None:
    if (
        isinstance(value, list)
        and value
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    ):
        return value
    return None


def tokenize_body(path: str, body: bytes) -> tuple[list[int] | None, dict[str, Any] | None]:
    """(the ids the request carries, or the `/tokenize` body that gets them); (None, None)
    when this request's prompt cannot be had."""
    try:
        payload = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, None
    if not isinstance(payload, dict):
        return None, None
    if path == "/v1/chat/completions" and isinstance(payload.get("messages"), list):
        return None, payload
    prompt = payload.get("prompt") if path == "/v1/completions" else None
    if path == "/generate":
        prompt = payload.get("text", payload.get("input_ids"))
    if isinstance(prompt, str):
        return None, {"prompt": prompt}
    return _ids(prompt), None


async def prompt_token_ids(
    session: aiohttp.ClientSession,
    worker_url: str,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
) -> list[int] | None:
    """The prompt's token ids as `worker_url` tokenizes it; None when they cannot be had."""
    ids, tokenize = tokenize_body(path, body)
    if tokenize is None:
        return ids
    try:
        async with session.post(
            worker_url + "/tokenize",
            json=tokenize,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=TOKENIZE_TIMEOUT_S),
        ) as reply:
            if reply.status != 200:
                return None
            return _ids((await reply.json()).get("tokens"))
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        logger.debug("tokenizing on %s failed: %r", worker_url, exc)
        return None
