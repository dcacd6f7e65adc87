"""vLLM's KV event wire types as `vllm/distributed/kv_events.py` defines them (copied: the
reference our stream is decoded with), and its block-hash chain written out with hashlib and
cbor2, independently of radixserve.kv_event_format."""

from __future__ import annotations

import hashlib
from typing import Any

import cbor2
import msgspec


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    """Base class for all KV cache-related events"""


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)


def reference_hashes(
    tokens: list[int], block_size: int, extra_keys: list[Any] | None = None
) -> list[int]:
    """vLLM's hash_block_tokens with sha256_cbor, written out: each block hashes
    (parent, its tokens, extra keys); the low 64 bits go on the wire. `extra_keys` are every
    block's as `generate_block_hash_extra_keys` lists them (a LoRA request's: [lora_name]),
    hashed as `tuple(extra_keys) or None`."""
    extra = tuple(extra_keys) if extra_keys else None
    parent = hashlib.sha256(cbor2.dumps("0", canonical=True)).digest()
    out = []
    for i in range(len(tokens) // block_size):
        block = tuple(tokens[i * block_size : (i + 1) * block_size])
        parent = hashlib.sha256(cbor2.dumps((parent, block, extra), canonical=True)).digest()
        out.append(int.from_bytes(parent, "big") & ((1 << 64) - 1))
    return out
