"""The radix cache's side of KV events: what it tells a sink when it stores or drops KV.

The cache speaks in token ranges of its tree (a node is a run of tokens under a path from the
root), not in blocks: a sink (`radixserve.mem_cache.kv_events.BlockEventSink` for
`--kv-events-endpoint`) turns the ranges into fixed-size blocks and hashes. Every tier of the
cache reports through the same three calls, naming its medium, so a consumer sees pages move.
The cache holds `None` instead of a sink when events are off: one attribute test per call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

# vLLM's medium names: a consumer (llm-d's indexer, Dynamo) reads the tier from them
Medium = Literal["GPU", "CPU", "DISK"]


class KVEventSink(Protocol):
    """Receives what a prefix cache stores and drops, per tier.

    `token_ids` is the whole token path from the root to the end of the node; `start` is where
    the node's own tokens begin in it (token_ids[start:] are the node's). A node's tokens are
    reported stored once they hold KV on `medium`, removed when that medium lets them go.
    """

    def stored(self, token_ids: Sequence[int], start: int, medium: Medium) -> None:
        """token_ids[start:] now hold KV on `medium` (token_ids[:start] already did)."""

    def removed(self, token_ids: Sequence[int], start: int, medium: Medium) -> None:
        """token_ids[start:] no longer hold KV on `medium`."""

    def cleared(self) -> None:
        """The whole cache was flushed: every block on every medium is gone."""


class AdapterEventSink(Protocol):
    """What the LoRA manager tells the event sink: the name each registration number serves.

    The cache keys an adapter's paths by its uid (`base_prefix_cache.adapter_key`), but events
    name adapters as vLLM does, by their served name. A uid is registered before any request
    runs under it and retired when its adapter is unloaded or replaced (a reload gets a new uid);
    its paths may stay in the cache after that, but no request can match them any more.
    """

    def adapter_registered(self, lora_uid: int, name: str) -> None:
        """Paths keyed by `lora_uid` are the adapter `name`'s."""

    def adapter_retired(self, lora_uid: int) -> None:
        """No request will run under `lora_uid` again: its blocks are useless to consumers."""
