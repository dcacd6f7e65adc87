"""The operator's calls to a worker pod's HTTP API, for spec.loras: the adapters a worker serves
(``GET /v1/models``: an adapter's card has ``parent``, the base model's name, and ``root``, its
path), the admin endpoints that change them (``POST /v1/load_lora_adapter {lora_name,
lora_path}``, ``POST /v1/unload_lora_adapter {lora_name}``: vLLM's names, guarded by the admin
key when the worker has one; a worker started with ``--lora-load lazy`` only registers the
path), and, for placement ``onDemand``, which adapters are resident and which failed to read
(``GET /get_server_info``'s ``lora_resident`` and ``lora_failed``, admin key too).

Async (aiohttp, which kopf itself runs on) with a timeout per call: a slow or dead pod holds
up only its own service's adapter sync, never the operator's event loop or other services.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp

# GET /v1/models and an unload are quick; a load may first fetch an hf:// adapter into the
# Hub cache (the worker's LoRA reader does it), so it gets minutes.
CALL_TIMEOUT_SECONDS = 10.0
LOAD_TIMEOUT_SECONDS = 300.0


@dataclass(frozen=True)
class WorkerEndpoint:
    """One ready worker pod, reached at its pod IP and the worker container's ``http`` port."""

    pod: str  # the pod's name, for messages
    uid: str  # the pod's uid: a refused load is remembered per pod, not per name
    url: str  # http://IP:PORT


class WorkerUnreachable(Exception):
    """The call did not get an answer worth acting on (connection, timeout, 401, 5xx, a body
    that is not the worker's): the pod is skipped this round and tried again later."""


class LoadRefused(Exception):
    """The worker refused the adapter (its 400, e.g. a rank over --max-lora-rank or a missing
    file); the message is the worker's own."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


async def served_adapters(
    session: aiohttp.ClientSession, endpoint: WorkerEndpoint, key: str | None
) -> dict[str, str]:
    """The adapters the worker serves: name -> the path it loaded them from."""
    body = await _call(session, "GET", endpoint, "/v1/models", key, None, CALL_TIMEOUT_SECONDS)
    try:
        cards = body["data"]
        return {card["id"]: str(card.get("root")) for card in cards if card.get("parent")}
    except (KeyError, TypeError) as error:
        raise WorkerUnreachable(f"pod {endpoint.pod}: /v1/models answered {body!r:.200}") from error


@dataclass(frozen=True)
class Residency:
    """What a lazily loading worker holds: the adapters in its device slots, and those whose
    last read failed (name -> why)."""

    resident: frozenset[str]
    failed: dict[str, str]


async def adapter_residency(
    session: aiohttp.ClientSession, endpoint: WorkerEndpoint, key: str | None
) -> Residency:
    """The worker's resident and failed adapters (its server info)."""
    body = await _call(
        session, "GET", endpoint, "/get_server_info", key, None, CALL_TIMEOUT_SECONDS
    )
    try:
        resident = frozenset(str(name) for name in body.get("lora_resident") or [])
        failed = {str(k): str(v) for k, v in (body.get("lora_failed") or {}).items()}
    except (AttributeError, TypeError) as error:
        raise WorkerUnreachable(f"pod {endpoint.pod}: /get_server_info: {error}") from error
    return Residency(resident, failed)


async def load_adapter(
    session: aiohttp.ClientSession,
    endpoint: WorkerEndpoint,
    key: str | None,
    name: str,
    path: str,
) -> None:
    """Load (or, for a name already served, replace) an adapter; ``LoadRefused`` on a 4xx."""
    payload = {"lora_name": name, "lora_path": path}
    await _call(
        session, "POST", endpoint, "/v1/load_lora_adapter", key, payload, LOAD_TIMEOUT_SECONDS
    )


async def unload_adapter(
    session: aiohttp.ClientSession, endpoint: WorkerEndpoint, key: str | None, name: str
) -> None:
    """Unload an adapter; one the worker no longer serves (its 404) is as good as unloaded."""
    try:
        payload = {"lora_name": name}
        await _call(
            session, "POST", endpoint, "/v1/unload_lora_adapter", key, payload, CALL_TIMEOUT_SECONDS
        )
    except LoadRefused as refused:
        if refused.status != 404:
            raise


async def _call(
    session: aiohttp.ClientSession,
    method: str,
    endpoint: WorkerEndpoint,
    path: str,
    key: str | None,
    payload: dict[str, Any] | None,
    timeout: float,
) -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        async with session.request(
            method,
            endpoint.url + path,
            json=payload,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            body = await response.json(content_type=None)
            status = response.status
    except (aiohttp.ClientError, TimeoutError, ValueError) as error:
        raise WorkerUnreachable(f"pod {endpoint.pod}: {path}: {error!r}") from error
    if status == 200:
        return body
    message = _error_message(body) or f"HTTP {status}"
    if 400 <= status < 500 and status not in (401, 403, 408, 429):
        raise LoadRefused(message, status)
    raise WorkerUnreachable(f"pod {endpoint.pod}: {path}: HTTP {status}: {message}")


def _error_message(body: Any) -> str | None:
    """OpenAI's error shape, ``{"error": {"message": ...}}``, as the worker answers."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = body["error"].get("message")
        return str(message) if message else None
    return None
