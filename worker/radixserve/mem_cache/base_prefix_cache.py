"""The interface the scheduler programs against for prefix caching.

Two implementations: `RadixCache` (shares KV of common prefixes across requests) and
`ChunkCache` (`--disable-radix-cache`: no sharing, but the same calls, so the scheduler has a
single code path).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from radixserve.mem_cache.kv_restore import KVRestore


class PrefixNode(Protocol):
    """The cache's handle on the node that ends a matched prefix: opaque to the scheduler,
    which only passes it back (to lock, unlock, or as a request's `last_node`). RadixCache's
    TreeNode is one; ChunkCache has none."""


class CacheableReq(Protocol):
    """The fields of the scheduler's `Req` that the caches read and write (duck-typed)."""

    req_pool_idx: int
    origin_input_ids: list[int]
    output_ids: list[int]
    kv_len: int
    prefix_indices: torch.Tensor
    last_node: Any
    lora_uid: int  # 0: the base model; else the LoRA adapter's namespace (adapter_key)


@dataclass
class MatchResult:
    """The cached prefix of a key: its KV slots and the tree node that ends it."""

    indices: torch.Tensor  # CPU int64 KV slots of the matched prefix (len = matched tokens)
    last_node: PrefixNode | None
    # tokens past `indices` that a lower tier (host memory, disk) holds: `restore` brings them
    restorable: int = 0


# an adapter's cache keys are its tokens plus `uid << ADAPTER_SHIFT`: above any vocabulary
ADAPTER_SHIFT = 32
_TOKEN_MASK = (1 << ADAPTER_SHIFT) - 1


def adapter_key(tokens: list[int], lora_uid: int) -> list[int]:
    """The cache key of `tokens` under a LoRA adapter: token ids moved above the vocabulary by
    the adapter's registration number (`lora_uid << 32`), so an adapter's prefixes only match its
    own (or, with uid 0, the base model's) and no cache learns about adapters. Whoever reads
    keys back as tokens (KV events, disk blocks) uses `split_adapter_key`."""
    if not lora_uid:
        return tokens
    offset = lora_uid << ADAPTER_SHIFT
    return [t + offset for t in tokens]


def split_adapter_key(key: Sequence[int]) -> tuple[int, Sequence[int]]:
    """(the adapter's uid, the token ids) of a cache key that `adapter_key` made; a base key
    (uid 0) comes back as it is. Every token of a key carries the same uid, so the first tells."""
    lora_uid = key[0] >> ADAPTER_SHIFT if key else 0
    if not lora_uid:
        return 0, key
    return lora_uid, tuple(t & _TOKEN_MASK for t in key)


def empty_slots() -> torch.Tensor:
    """A CPU int64 tensor of no KV slots."""
    return torch.empty(0, dtype=torch.int64)


class BasePrefixCache(ABC):
    """Prefix cache over KV slots; see RadixCache for the semantics of each call."""

    disabled: bool

    @abstractmethod
    def match_prefix(self, key: list[int]) -> MatchResult:
        """The longest cached prefix of `key`."""

    @abstractmethod
    def insert(self, key: list[int], value: torch.Tensor) -> int:
        """Cache `value` (KV slots) under `key`; return how many leading tokens were already cached.

        The caller owns value[:returned]: those slots duplicate the cache's and are the caller's
        to free (unless they are the cache's own, i.e. a locked prefix).
        """

    @abstractmethod
    def cache_finished_req(self, req: CacheableReq) -> None:
        """Hand a finished request's KV to the cache and release its row and its lock."""

    @abstractmethod
    def cache_unfinished_req(self, req: CacheableReq) -> None:
        """Cache a running request's KV so far (after a prefill chunk); it keeps its row."""

    @abstractmethod
    def release_req(self, req: CacheableReq) -> None:
        """A live request gives up its KV uncached (retraction): free its row and every slot
        the cache does not own, and drop its lock on what the cache does own."""

    @abstractmethod
    def inc_lock_ref(self, node: PrefixNode | None) -> None:
        """Pin `node` and its ancestors so eviction cannot take them."""

    @abstractmethod
    def dec_lock_ref(self, node: PrefixNode | None) -> None:
        """Undo one inc_lock_ref(node)."""

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots if possible; return how many were freed."""

    @abstractmethod
    def evictable_size(self) -> int:
        """Tokens in the cache that no running request pins."""

    @abstractmethod
    def protected_size(self) -> int:
        """Tokens in the cache pinned by running requests."""

    @abstractmethod
    def total_size(self) -> int:
        """Tokens in the cache."""

    def restore(self, key: list[int]) -> dict[str, int]:
        """Bring the lower-tier part of `key`'s match (`MatchResult.restorable`) onto the
        device; the tokens restored per tier. Only a tiered cache has lower tiers."""
        return {}

    def take_restore(self) -> KVRestore | None:
        """The restores this admission round queued, issued now that its pass launches: what
        the pass waits on layer by layer (None: nothing to wait for, always without tiers)."""
        return None

    def close(self) -> None:  # noqa: B027 - most caches have nothing to finish
        """At shutdown: finish what must outlive the process (the disk tier's writes)."""

    def tier_report(self) -> dict[str, Any] | None:
        """The lower tiers' usage and traffic since the last call (None: no lower tiers)."""
        return None

    @abstractmethod
    def reset(self) -> None:
        """Forget everything cached (the caller clears the allocator and the request pool)."""
