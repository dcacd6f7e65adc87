"""LoRA adapter affinity: a request whose `model` names a LoRA adapter goes to a worker that
already has the adapter resident, and among those the routing policy's prefix and load rules
decide; with no such worker (or none within `slack` of the least loaded) every candidate is
considered, and the worker chosen loads the adapter on demand.

What a worker has comes from two places: its `radixserve_lora_requests_info` gauge (the
adapters of its running and waiting requests: the Gateway API Inference Extension protocol,
read from the `/metrics` the prober fetches anyway) and where this router last sent each
adapter (which that worker then holds until its slots turn over). Which names are adapters
comes from the workers' `/v1/models` (cards with a `parent`); a name no worker lists is still
placed by adapter, so a fleet that loads adapters on demand keeps them together.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from prometheus_client.parser import text_string_to_metric_families

LORA_INFO = "radixserve_lora_requests_info"
DEFAULT_CAPACITY = 4096  # adapters whose last placement is remembered


class AdapterHolder(Protocol):
    @property
    def url(self) -> str: ...

    @property
    def load(self) -> float: ...

    @property
    def lora_adapters(self) -> frozenset[str]: ...


H = TypeVar("H", bound=AdapterHolder)


def adapters_in_metrics(exposition: str) -> frozenset[str] | None:
    """The adapters a worker's latest `radixserve_lora_requests_info` lists (running and
    waiting); None when the worker reports no such gauge (it serves no adapters)."""
    if LORA_INFO not in exposition:
        return None
    latest: tuple[float, dict[str, str]] | None = None
    for family in text_string_to_metric_families(exposition):
        if family.name != LORA_INFO:
            continue
        for sample in family.samples:
            if latest is None or sample.value > latest[0]:
                latest = (sample.value, sample.labels)
    if latest is None:
        return frozenset()
    names = []
    for label in ("running_lora_adapters", "waiting_lora_adapters"):
        names += [n for n in latest[1].get(label, "").split(",") if n]
    return frozenset(names)


def adapters_in_models(payload: Any) -> frozenset[str]:
    """The adapters a worker's `/v1/models` lists (the cards with a parent)."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return frozenset()
    return frozenset(
        card["id"]
        for card in data
        if isinstance(card, dict) and card.get("parent") and isinstance(card.get("id"), str)
    )


def requested_model(body: bytes) -> str | None:
    """The `model` a request body names, if any (JSON bodies only)."""
    if b'"model"' not in body:
        return None
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    model = payload.get("model") if isinstance(payload, dict) else None
    return model if isinstance(model, str) else None


class AdapterAffinity:
    def __init__(self, slack: float, capacity: int = DEFAULT_CAPACITY) -> None:
        self.slack = slack  # how much busier than the least loaded worker a holder may be
        self.capacity = capacity
        self._placed: OrderedDict[str, str] = OrderedDict()  # adapter -> URL last sent to
        self.base_models: set[str] = set()  # names the workers list as base models
        self.known: set[str] = set()  # names the workers list as adapters
        # some worker reports adapters: requests' `model` is read (never, on a fleet without)
        self.active = False

    def is_adapter(self, model: str | None) -> bool:
        return model is not None and model not in self.base_models

    def prefer(self, adapter: str, candidates: Sequence[H]) -> tuple[list[H], bool]:
        """The candidates to choose among: the holders of `adapter` when one of them is within
        `slack` of the least loaded candidate (True), else all of them (False)."""
        placed = self._placed.get(adapter)
        holders = [c for c in candidates if adapter in c.lora_adapters or c.url == placed]
        if holders:
            lightest = min(c.load for c in candidates)
            if min(h.load for h in holders) <= lightest + self.slack:
                return holders, True
        return list(candidates), False

    def placed(self, adapter: str, url: str) -> None:
        self._placed[adapter] = url
        self._placed.move_to_end(adapter)
        while len(self._placed) > self.capacity:
            self._placed.popitem(last=False)

    def learn_models(self, payload: Any) -> None:
        """A worker's `/v1/models`: its adapters, and its base model's names."""
        adapters = adapters_in_models(payload)
        self.known |= adapters
        data = payload.get("data") if isinstance(payload, dict) else None
        for card in data if isinstance(data, list) else []:
            if (
                isinstance(card, dict)
                and not card.get("parent")
                and isinstance(card.get("id"), str)
            ):
                self.base_models.add(card["id"])

    def forget(self, url: str) -> None:
        """A worker left the pool or was flushed: nothing is placed there any more."""
        for adapter in [a for a, u in self._placed.items() if u == url]:
            del self._placed[adapter]
