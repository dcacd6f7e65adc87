"""KV events on the wire: vLLM's msgspec structs and its block-hash chain (torch-free leaf).

The worker publishes these (`mem_cache/kv_events.py`) and the router decodes them
(`router/kv_index.py`); so do llm-d's KV-cache indexer and Dynamo's KV router, which is why
every detail follows vLLM's `vllm/distributed/kv_events.py`: the struct options (`array_like`,
`omit_defaults`, `gc=False`, tagged events named by their class), the field order, and the
frames `(topic, 8-byte big-endian sequence number, msgpack EventBatch)`.

Blocks are runs of `block_size` tokens from the start of a token path. A block's hash chains
its parent's, as vLLM's `hash_block_tokens` with `sha256_cbor`: SHA-256 of the canonical CBOR
of `(parent hash, block token ids, extra keys)`, the first block's parent being `NONE_HASH`
(from a fixed seed, so every process and restart agrees); on the wire a hash is its low 64 bits
as an unsigned integer (vLLM's `maybe_convert_block_hash`).

A LoRA adapter's blocks hash as vLLM's do (`kv_cache_utils.generate_block_hash_extra_keys`):
every block's extra keys are `(adapter name,)`, so the same tokens under another adapter, or
under the base model (extra keys None), chain to other hashes, and a consumer that knows the
request's adapter name computes the worker's hashes without knowing the worker.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import Any

import cbor2
import msgspec

# vLLM's names for where a block lives (`BlockStored.medium`, `BlockRemoved.medium`)
MEDIUMS = ("GPU", "CPU", "DISK")
# a replay reply ends with this sequence number and an empty payload (vLLM's END_SEQ)
END_SEQ = (-1).to_bytes(8, "big", signed=True)
DEFAULT_BLOCK_SIZE = 16


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    """Base class of the events; `tag=True` names each by its class on the wire."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def sha256_cbor(value: Any) -> bytes:
    """vLLM's `sha256_cbor`: SHA-256 of the canonical CBOR, the same in any language."""
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


NONE_HASH = sha256_cbor("0")  # the parent of every first block


@functools.lru_cache(maxsize=1 << 16)
def hash_block(parent: bytes, tokens: tuple[int, ...], extra_keys: tuple[Any, ...] | None) -> bytes:
    """One link of the chain (memoized: shared prefixes are hashed again and again)."""
    return sha256_cbor((parent, tokens, extra_keys))


def external_hash(block_hash: bytes) -> int:
    """The hash as events carry it: the low 64 bits, unsigned."""
    return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)


def lora_extra_keys(lora_name: str | None) -> tuple[str] | None:
    """The extra keys of every block of a path under `lora_name` (None: the base model)."""
    return None if lora_name is None else (lora_name,)


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    num_blocks: int | None = None,
    lora_name: str | None = None,
) -> list[int]:
    """The wire hashes of the first `num_blocks` (default: every full) blocks of a token path,
    under the LoRA adapter `lora_name` (None: the base model)."""
    tokens = tuple(token_ids)
    count = len(tokens) // block_size if num_blocks is None else num_blocks
    extra_keys = lora_extra_keys(lora_name)
    parent = NONE_HASH
    hashes = []
    for i in range(count):
        parent = hash_block(parent, tokens[i * block_size : (i + 1) * block_size], extra_keys)
        hashes.append(external_hash(parent))
    return hashes
