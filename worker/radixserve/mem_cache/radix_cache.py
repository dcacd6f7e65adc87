"""Token-level radix tree over KV slot indices (the design of SGLang's RadixCache).

Each edge holds a run of token ids (`key`) and the KV slots that hold their K/V (`value`).
Requests that share a prompt prefix share those slots: admission matches the longest cached
prefix and locks it; a finished request inserts its tokens so later requests can reuse them.
Unlocked leaves are evicted least-recently-used first when the allocator runs dry, from a heap
the tree keeps as it changes (`lru_heap.LRUHeap`: a leaf is offered when it is made, touched or
unlocked, or loses its last child), not gathered by a walk of the whole tree at each eviction.
With KV events on, the cache tells its `event_sink` (see `kv_event_sink`) what it stores and
drops on the GPU; with them off the sink is None and nothing else runs.
"""

from __future__ import annotations

import itertools

import torch

from radixserve.mem_cache.allocator import TokenSlotAllocator
from radixserve.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    CacheableReq,
    MatchResult,
    adapter_key,
    empty_slots,
)
from radixserve.mem_cache.kv_event_sink import KVEventSink
from radixserve.mem_cache.lru_heap import LRUHeap
from radixserve.mem_cache.memory_pool import ReqToTokenPool

_node_ids = itertools.count()


class TreeNode:
    """One edge of the tree and the node it leads to."""

    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access_time", "id")

    def __init__(self, key: list[int], value: torch.Tensor, parent: TreeNode | None) -> None:
        self.children: dict[int, TreeNode] = {}  # first token of the child's key -> child
        self.parent = parent
        self.key = key
        self.value = value  # CPU int64 KV slots, one per token of `key`
        self.lock_ref = 0  # running requests whose matched prefix ends at or below this node
        self.last_access_time = 0
        self.id = next(_node_ids)  # tie-breaker in the eviction heap


def _common_prefix_len(node_key: list[int], key: list[int], offset: int) -> int:
    """How many leading tokens of `node_key` equal key[offset:]."""
    limit = min(len(node_key), len(key) - offset)
    i = 0
    while i < limit and node_key[i] == key[offset + i]:
        i += 1
    return i


class RadixCache(BasePrefixCache):
    """Prefix cache sharing KV slots between requests; see the module docstring."""

    disabled = False

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool_allocator: TokenSlotAllocator,
        event_sink: KVEventSink | None = None,
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.event_sink: KVEventSink | None = None
        self.reset()
        self.event_sink = event_sink  # after the first reset: a new cache clears nothing

    def reset(self) -> None:
        if self.event_sink is not None:
            self.event_sink.cleared()
        self.root_node = TreeNode([], empty_slots(), None)
        self._evictable_size = 0
        self._protected_size = 0
        self._clock = 0
        # unlocked leaves, by access time
        self._lru = LRUHeap(
            self.root_node, self._may_evict, self._may_evict, self._evictable_leaves
        )

    def _tick(self) -> int:
        """The LRU clock: a counter, so access order is exact and needs no system call."""
        self._clock += 1
        return self._clock

    # --- tree operations -------------------------------------------------------------------

    def match_prefix(self, key: list[int]) -> MatchResult:
        """The longest cached prefix of `key`.

        A node matched only partly is split, so `last_node` ends exactly at the matched prefix
        and locking it pins nothing beyond it.
        """
        now = self._tick()
        node = self.root_node
        matched: list[torch.Tensor] = []
        pos = 0
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            child.last_access_time = now
            n = _common_prefix_len(child.key, key, pos)
            if n < len(child.key):
                # The next key token differs from the lower half's first token (or the key
                # ends), so the loop stops at the new upper node.
                self._offer(child)  # the lower half: a leaf still, touched now
                child = self._split_node(child, n)
            matched.append(child.value)
            node = child
            pos += n
        self._offer(node)  # the only touched node that may be a leaf
        indices = torch.cat(matched) if matched else empty_slots()
        return MatchResult(indices=indices, last_node=node)

    def insert(self, key: list[int], value: torch.Tensor) -> int:
        """Store `value` under `key`; return how many leading tokens the tree already had.

        Slots already in the tree keep their existing value; value[:returned] is the caller's.
        """
        if len(key) != value.numel():
            raise ValueError(f"key has {len(key)} tokens but value has {value.numel()} slots")
        now = self._tick()
        node = self.root_node
        pos = 0
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                leaf = TreeNode(key[pos:], value[pos:], node)
                leaf.last_access_time = now
                node.children[key[pos]] = leaf
                self._evictable_size += len(leaf.key)
                if self.event_sink is not None:
                    self.event_sink.stored(key, pos, "GPU")
                self._offer(leaf)
                return pos
            child.last_access_time = now
            n = _common_prefix_len(child.key, key, pos)
            if n < len(child.key):
                self._offer(child)  # the lower half: a leaf still, touched now
                child = self._split_node(child, n)
            node = child
            pos += n
        self._offer(node)  # the key ended at a node, perhaps a leaf, touched now
        return pos

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut `child`'s edge after `split_len` tokens; return the new upper node.

        The upper node inherits the lock count: every request locking `child` also pins it.
        """
        parent = child.parent
        assert parent is not None, "the root is never split"
        upper = TreeNode(child.key[:split_len], child.value[:split_len], parent)
        upper.lock_ref = child.lock_ref
        upper.last_access_time = child.last_access_time
        parent.children[child.key[0]] = upper
        child.key = child.key[split_len:]
        child.value = child.value[split_len:]
        child.parent = upper
        upper.children[child.key[0]] = child
        return upper

    # --- locking ---------------------------------------------------------------------------

    def inc_lock_ref(self, node: TreeNode | None) -> None:
        while node is not None and node is not self.root_node:
            if node.lock_ref == 0:
                self._evictable_size -= len(node.key)
                self._protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode | None) -> None:
        while node is not None and node is not self.root_node:
            if node.lock_ref <= 0:
                raise RuntimeError("dec_lock_ref on a node that is not locked")
            if node.lock_ref == 1:
                self._evictable_size += len(node.key)
                self._protected_size -= len(node.key)
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._offer(node)
            node = node.parent

    # --- eviction --------------------------------------------------------------------------

    def evict(self, num_tokens: int) -> int:
        """Evict least-recently-used unlocked leaves until `num_tokens` slots are freed.

        A parent left childless and unlocked becomes a candidate in the same pass. Returns
        the tokens freed, which is less than asked when everything left is locked.
        """
        freed: list[torch.Tensor] = []
        num_evicted = 0
        while num_evicted < num_tokens:
            leaf = self._lru.pop()
            if leaf is None:
                break
            parent = leaf.parent
            assert parent is not None
            if self.event_sink is not None:
                path = self.token_path(leaf)
                self.event_sink.removed(path, len(path) - len(leaf.key), "GPU")
            del parent.children[leaf.key[0]]
            freed.append(leaf.value)
            num_evicted += len(leaf.key)
            self._evictable_size -= len(leaf.key)
            if parent is not self.root_node:
                self._offer(parent)
        if freed:
            self.token_to_kv_pool_allocator.free(torch.cat(freed))
        return num_evicted

    def _offer(self, node: TreeNode) -> None:
        """Tell the LRU heap that `node` was made, touched, unlocked or left childless."""
        self._lru.offer(node)

    def _may_evict(self, node: TreeNode) -> bool:
        """An unlocked leaf (the root aside): O(1), so the heap tests it on every offer."""
        return not node.lock_ref and not node.children and node is not self.root_node

    def token_path(self, node: TreeNode) -> list[int]:
        """The tokens from the root to the end of `node` (what an event sink is given)."""
        keys = []
        while node is not self.root_node and node is not None:
            keys.append(node.key)
            node = node.parent
        return [token for key in reversed(keys) for token in key]

    def _evictable_leaves(self) -> list[TreeNode]:
        leaves = []
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node.lock_ref == 0:
                leaves.append(node)
        return leaves

    # --- sizes -----------------------------------------------------------------------------

    def evictable_size(self) -> int:
        return self._evictable_size

    def protected_size(self) -> int:
        return self._protected_size

    def total_size(self) -> int:
        return self._evictable_size + self._protected_size

    def all_values(self) -> torch.Tensor:
        """Every KV slot the tree holds (walks the tree: for checks and debugging only)."""
        values = []
        stack = [self.root_node]
        while stack:
            node = stack.pop()
            values.append(node.value)
            stack.extend(node.children.values())
        return torch.cat(values)

    # --- request lifecycle -----------------------------------------------------------------

    def _insert_req_kv(self, req: CacheableReq) -> tuple[list[int], torch.Tensor]:
        """Insert the request's cached tokens; free its slots that duplicate the tree's.

        Returns the key and the row's slots that were inserted.
        """
        key = adapter_key((req.origin_input_ids + req.output_ids)[: req.kv_len], req.lora_uid)
        kv_indices = self.req_to_token_pool.read(req.req_pool_idx, req.kv_len)
        num_already_cached = self.insert(key, kv_indices)
        # row[:len(prefix)] are the tree's own slots (the locked prefix); the rest of the
        # already-cached part was computed again by this request and is a duplicate.
        num_prefix = len(req.prefix_indices)
        self.token_to_kv_pool_allocator.free(kv_indices[num_prefix:num_already_cached])
        return key, kv_indices

    def cache_finished_req(self, req: CacheableReq) -> None:
        self._insert_req_kv(req)
        self.req_to_token_pool.free(req.req_pool_idx)
        self.dec_lock_ref(req.last_node)

    def release_req(self, req: CacheableReq) -> None:
        """The matched (or chunk-cached) prefix is the tree's, locked by `last_node`; the rest
        of the row is the request's own."""
        own = self.req_to_token_pool.read(req.req_pool_idx, req.kv_len)[len(req.prefix_indices) :]
        self.token_to_kv_pool_allocator.free(own)
        self.req_to_token_pool.free(req.req_pool_idx)
        self.dec_lock_ref(req.last_node)

    def cache_unfinished_req(self, req: CacheableReq) -> None:
        key, _ = self._insert_req_kv(req)
        match = self.match_prefix(key)
        new_indices = match.indices
        num_prefix = len(req.prefix_indices)
        # Point the row at the tree's slots where the request's own duplicates were freed.
        self.req_to_token_pool.write(req.req_pool_idx, num_prefix, new_indices[num_prefix:])
        self.inc_lock_ref(match.last_node)
        self.dec_lock_ref(req.last_node)
        req.prefix_indices = new_indices
        req.last_node = match.last_node
