"""The radix cache with a host-memory tier (`--kv-host-memory`) and a disk tier (`--kv-disk-path`).

Each node records where its tokens' KV lives: `value` (device slots) and `host_value` (host
slots), either or both. Device-resident nodes form a subtree from the root, so a match is a
device prefix followed by host-only nodes, and then, past the tree, whole disk blocks.

- Eviction from the device keeps a node in the tree when its KV is on the host: written there
  just before eviction (`write_back`, the default) or when the request that computed it
  finished (`write_through`). Without room on the host the node goes, as without the tier.
- The host tier has its own LRU: host-only leaves that no request locks go first.
- Both tiers' candidates come from heaps the tree keeps as it changes (`lru_heap.LRUHeap`, as in
  the plain cache): a node is offered to both wherever it is made, touched, unlocked, gains or
  loses device slots, or loses a child, and each heap tests its own rule as it pops.
- A match reports how many tokens beyond the device prefix the host and disk hold
  (`MatchResult.restorable`); admission calls `restore`, which reads disk blocks into the
  host tier, gives host-resident nodes fresh device slots and queues their copies, then
  matches again. The round's copies are issued when its pass launches (`take_restore`): on
  CUDA on a separate stream, layer group by layer group, each layer of the pass waiting only
  for its own group (host_pool.py, kv_restore.py). A node evicted again before the launch
  takes its queued copy with it.
- The disk tier gets every whole block of a finished request's tokens not yet stored there,
  written by its own thread (`DiskKVStore`). An adapter's blocks are named by its raw tokens
  and the digest of its weights (`adapter_identity`), not by the uid its cache keys carry: a
  restarted worker, or a reload of the same weights, finds them again, and other weights
  under the same name do not. A path whose adapter has no digest yet skips the disk.
- KV events: nodes report `GPU` as they gain or lose device slots and `CPU` as they gain or lose
  host slots; the disk tier reports `DISK` for its blocks (the `event_sink` setter hands it
  the sink), from its writer thread as files land and wherever they go.

Sizes: `evictable_size` and `protected_size` count device tokens only, exactly as the plain
cache does (the scheduler budgets device slots with them); the host tier counts its slots in
its own allocator. Locks pin a node in every tier.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from radixserve.host_memory import available_memory_bytes
from radixserve.mem_cache.allocator import TokenSlotAllocator
from radixserve.mem_cache.base_prefix_cache import (
    CacheableReq,
    MatchResult,
    adapter_key,
    empty_slots,
    split_adapter_key,
)
from radixserve.mem_cache.disk_store import (
    BLOCK_TOKENS,
    DiskBlock,
    DiskKey,
    DiskKVStore,
    fingerprint_of,
)
from radixserve.mem_cache.host_pool import HostKVPool, kv_buffers
from radixserve.mem_cache.kv_event_sink import KVEventSink, Medium
from radixserve.mem_cache.kv_restore import KVRestore
from radixserve.mem_cache.lru_heap import LRUHeap
from radixserve.mem_cache.memory_pool import ReqToTokenPool
from radixserve.mem_cache.radix_cache import RadixCache, TreeNode, _common_prefix_len
from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)

WRITE_POLICIES = ("write_back", "write_through")
TIERS = ("gpu", "host", "disk")
GB = 1 << 30


class TieredNode(TreeNode):
    """A tree node whose KV may be on the device (`value`), the host (`host_value`) or both."""

    __slots__ = ("host_value",)

    def __init__(
        self,
        key: list[int],
        value: torch.Tensor | None,
        parent: TreeNode | None,
        host_value: torch.Tensor | None = None,
    ) -> None:
        super().__init__(key, value, parent)  # type: ignore[arg-type]
        self.host_value = host_value


@dataclass
class TierCounters:
    """What the tiers moved since the last report (bytes per tier) and the restore latencies."""

    written: dict[str, int] = field(default_factory=lambda: {"host": 0, "disk": 0})
    restored: dict[str, int] = field(default_factory=lambda: {"host": 0, "disk": 0})
    dropped: dict[str, int] = field(default_factory=lambda: {"host": 0, "disk": 0})


class TieredRadixCache(RadixCache):
    """RadixCache plus the host tier and, optionally, the disk tier; see the module docstring."""

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool_allocator: TokenSlotAllocator,
        host_pool: HostKVPool,
        write_policy: str = "write_back",
        disk: DiskKVStore | None = None,
        event_sink: KVEventSink | None = None,
    ) -> None:
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"write policy must be one of {WRITE_POLICIES}, got {write_policy!r}")
        self.host_pool = host_pool
        self.write_through = write_policy == "write_through"
        self.disk = disk
        self.counters = TierCounters()
        self._queued_backups: list[tuple[torch.Tensor, torch.Tensor]] = []  # (device, host)
        self._disk_bytes_seen = (0, 0)  # the disk store's running totals at the last report
        # an adapter uid's identity for the disk tier (the LoRA manager's `identity`; None
        # without adapters): its blocks are named by it, so a restart finds them again
        self.adapter_identity: Callable[[int], bytes | None] | None = None
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, event_sink)

    @property  # type: ignore[override]
    def event_sink(self) -> KVEventSink | None:
        return self._event_sink

    @event_sink.setter
    def event_sink(self, sink: KVEventSink | None) -> None:
        """The disk tier reports its blocks (medium DISK) to the same sink."""
        self._event_sink = sink
        if self.disk is not None:
            self.disk.set_event_sink(sink)

    def reset(self) -> None:
        super().reset()
        self.root_node = TieredNode([], empty_slots(), None, empty_slots())
        # device eviction: unlocked device-resident nodes without a device-resident child
        self._lru = LRUHeap(
            self.root_node, self._may_evict, self._device_leaf, self._evictable_leaves
        )
        # host eviction: unlocked host-only leaves
        self._host_lru = LRUHeap(
            self.root_node, self._host_leaf, self._host_leaf, self._host_leaves
        )
        self.host_pool.clear()
        if self.disk is not None:  # the sink was told everything went: the disk's blocks stay
            self.disk.announce()

    def _emit(self, kind: str, node: TreeNode, medium: Medium) -> None:
        if self.event_sink is None:
            return
        path = self.token_path(node)
        getattr(self.event_sink, kind)(path, len(path) - len(node.key), medium)

    # --- matching --------------------------------------------------------------------------

    def _walk(self, key: Sequence[int]) -> tuple[list[torch.Tensor], TreeNode, TreeNode, int]:
        """(device slots of the device prefix, its last node, the deepest matched node, the
        matched length). Partly matched nodes are split, as in RadixCache.match_prefix."""
        now = self._tick()
        node = device_node = self.root_node
        device: list[torch.Tensor] = []
        pos = 0
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            child.last_access_time = now
            n = _common_prefix_len(child.key, key, pos)  # type: ignore[arg-type]
            if n < len(child.key):
                self._offer(child)  # the lower half, touched now
                child = self._split_node(child, n)
            if child.value is not None and node is device_node:
                device.append(child.value)
                device_node = child
            node = child
            pos += n
        # the touched nodes that may be candidates: the deepest device node (a device leaf
        # when what follows is host-only) and the deepest node (a host-only leaf)
        self._offer(device_node)
        self._offer(node)
        return device, device_node, node, pos

    def match_prefix(self, key: list[int]) -> MatchResult:
        device, device_node, _, pos = self._walk(key)
        device_len = sum(t.numel() for t in device)
        restorable = pos - device_len
        if self.disk is not None and len(key) - pos >= self.disk.block_tokens:
            disk_key = self._disk_key(key)
            restorable += self._disk_run(disk_key, pos)[1] if disk_key else 0
        indices = torch.cat(device) if device else empty_slots()
        return MatchResult(indices=indices, last_node=device_node, restorable=restorable)

    def _disk_key(self, key: Sequence[int]) -> DiskKey | None:
        """The disk tier's view of a cache key: the raw tokens and the adapter's identity (its
        weights' digest, stable across restarts, where the uid is not). None for an adapter
        whose identity is not known (its weights not read yet): that path skips the disk."""
        lora_uid, tokens = split_adapter_key(key)
        if not lora_uid:
            return DiskKey(tokens, b"", 0)
        identity = self.adapter_identity(lora_uid) if self.adapter_identity else None
        return DiskKey(tokens, identity, lora_uid) if identity else None

    def _disk_run(self, disk_key: DiskKey, pos: int) -> tuple[list[str], int]:
        """The block names of a key and how many tokens past `pos` its consecutive disk blocks
        (from the one holding `pos`) cover."""
        assert self.disk is not None
        size = self.disk.block_tokens
        names = self.disk.block_names(disk_key.tokens, disk_key.adapter)
        end = pos
        for i in range(pos // size, len(names)):
            if not self.disk.contains(names[i]):
                break
            end = (i + 1) * size
        return names, end - pos

    # --- restoring (admission) -------------------------------------------------------------

    def restore(self, key: list[int]) -> dict[str, int]:
        """Bring the host- and disk-resident part of `key`'s match onto the device; return the
        tokens restored from each tier. Nothing is restored when the device cannot make room."""
        restored = {"host": 0, "disk": 0}
        _, device_node, deepest, pos = self._walk(key)
        self.inc_lock_ref(deepest)  # nothing on the path may go while we make room
        try:
            if self.disk is not None and len(key) - pos >= self.disk.block_tokens:
                node = self._restore_from_disk(key, pos, deepest)
                if node is not deepest:
                    restored["disk"] = len(node.key)
                    self.inc_lock_ref(node)
                    self.dec_lock_ref(deepest)
                    deepest = node
            path = []
            node = deepest
            while node is not device_node:
                path.append(node)
                node = node.parent
            need = sum(len(n.key) for n in path)
            if need == 0:
                return restored
            available = self.token_to_kv_pool_allocator.available_size()
            if available < need:
                self.evict(need - available)
            slots = self.token_to_kv_pool_allocator.alloc(need)
            if slots is None:
                return {"host": 0, "disk": 0}
            offset = 0
            for node in reversed(path):
                part = slots[offset : offset + len(node.key)]
                offset += len(node.key)
                self.host_pool.queue_restore(node.host_value, part)
                node.value = part
                self._protected_size += len(node.key)  # locked above
                self._emit("stored", node, "GPU")
            restored["host"] = need - restored["disk"]
            self.counters.restored["host"] += need * self.host_pool.bytes_per_token
            return restored
        finally:
            self.dec_lock_ref(deepest)

    def take_restore(self) -> KVRestore | None:
        return self.host_pool.issue_restores()

    def _restore_from_disk(self, key: Sequence[int], pos: int, parent: TreeNode) -> TreeNode:
        """Read the disk blocks past `pos` into host slots as a new host-only child of
        `parent`; return it (or `parent` when nothing could be read)."""
        assert self.disk is not None
        disk_key = self._disk_key(key)
        if disk_key is None:
            return parent
        names, covered = self._disk_run(disk_key, pos)
        if covered == 0:
            return parent
        size = self.disk.block_tokens
        first = pos // size
        blocks = []
        for i in range(first, (pos + covered) // size):
            tokens = list(disk_key.tokens[i * size : (i + 1) * size])
            data = self.disk.read(names[i], self.disk.parent_of(names, i), tokens)
            if data is None or data.shape != (size, self.host_pool.bytes_per_token):
                break
            blocks.append(data)
        if not blocks:
            return parent
        # the first block may start before `pos`: those tokens are in the tree already
        data = torch.cat(blocks)[pos - first * size :]
        n = data.shape[0]
        host_slots = self._alloc_host(n)
        if host_slots is None:
            return parent
        self.host_pool.write(host_slots, data)
        node = TieredNode(list(key[pos : pos + n]), None, parent, host_slots)
        node.last_access_time = self._tick()
        parent.children[node.key[0]] = node
        self.counters.restored["disk"] += n * self.host_pool.bytes_per_token
        self._emit("stored", node, "CPU")
        return node

    # --- inserting -------------------------------------------------------------------------

    def insert(self, key: list[int], value: torch.Tensor) -> int:
        """As RadixCache.insert, except that a host-only node the key covers adopts the
        caller's slots for its tokens (`last_adopted` lists those ranges: they are the tree's
        now, not duplicates to free)."""
        if len(key) != value.numel():
            raise ValueError(f"key has {len(key)} tokens but value has {value.numel()} slots")
        self.last_adopted: list[tuple[int, int]] = []
        now = self._tick()
        node = self.root_node
        pos = 0
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                leaf = TieredNode(key[pos:], value[pos:], node)
                leaf.last_access_time = now
                node.children[key[pos]] = leaf
                self._evictable_size += len(leaf.key)
                self._emit("stored", leaf, "GPU")
                self._offer(leaf)
                return pos
            child.last_access_time = now
            n = _common_prefix_len(child.key, key, pos)
            if n < len(child.key):
                self._offer(child)  # the lower half, touched now
                child = self._split_node(child, n)
            if child.value is None:
                child.value = value[pos : pos + n]
                self.last_adopted.append((pos, pos + n))
                if child.lock_ref == 0:
                    self._evictable_size += n
                else:
                    self._protected_size += n
                self._emit("stored", child, "GPU")
            node = child
            pos += n
        self._offer(node)  # the key ended at a node, device-resident now, touched now
        return pos

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        parent = child.parent
        assert parent is not None, "the root is never split"
        host = child.host_value  # type: ignore[attr-defined]
        upper = TieredNode(
            child.key[:split_len],
            None if child.value is None else child.value[:split_len],
            parent,
            None if host is None else host[:split_len],
        )
        upper.lock_ref = child.lock_ref
        upper.last_access_time = child.last_access_time
        parent.children[child.key[0]] = upper
        child.key = child.key[split_len:]
        if child.value is not None:
            child.value = child.value[split_len:]
        if host is not None:
            child.host_value = host[split_len:]  # type: ignore[attr-defined]
        child.parent = upper
        upper.children[child.key[0]] = child
        return upper

    def _insert_req_kv(self, req: CacheableReq) -> tuple[list[int], torch.Tensor]:
        key = adapter_key((req.origin_input_ids + req.output_ids)[: req.kv_len], req.lora_uid)
        kv_indices = self.req_to_token_pool.read(req.req_pool_idx, req.kv_len)
        num_already_cached = self.insert(key, kv_indices)
        duplicate = torch.zeros(req.kv_len, dtype=torch.bool)
        duplicate[len(req.prefix_indices) : num_already_cached] = True
        for start, end in self.last_adopted:
            duplicate[start:end] = False
        self.token_to_kv_pool_allocator.free(kv_indices[duplicate])
        return key, kv_indices

    def cache_finished_req(self, req: CacheableReq) -> None:
        key, _ = self._insert_req_kv(req)
        if self.write_through or self.disk is not None:
            path = self._path(key)
            if self.write_through:
                for node in path:
                    if node.host_value is None:  # type: ignore[attr-defined]
                        self._backup(node)
                self._flush_backups()
            if self.disk is not None:
                self._write_disk(key, path)
        self.req_to_token_pool.free(req.req_pool_idx)
        self.dec_lock_ref(req.last_node)

    def _path(self, key: Sequence[int]) -> list[TreeNode]:
        """The nodes spelling `key` exactly (it was just inserted: it ends on a node)."""
        nodes = []
        node = self.root_node
        pos = 0
        while pos < len(key):
            node = node.children[key[pos]]
            nodes.append(node)
            pos += len(node.key)
        return nodes

    def _write_disk(self, key: Sequence[int], path: list[TreeNode]) -> None:
        """Queue the whole blocks of `key` the disk tier lacks (gathered from the device)."""
        assert self.disk is not None
        disk_key = self._disk_key(key)
        if disk_key is None:
            return
        names = self.disk.block_names(disk_key.tokens, disk_key.adapter)
        missing = [i for i, name in enumerate(names) if not self.disk.known(name)]
        if not missing:
            return
        size = self.disk.block_tokens
        slots = torch.cat([n.value for n in path])  # all on the device: just inserted
        for i in missing:
            data, ready = self.host_pool.gather(slots[i * size : (i + 1) * size])
            block = DiskBlock(
                names[i],
                self.disk.parent_of(names, i),
                list(disk_key.tokens[i * size : (i + 1) * size]),
                disk_key.adapter,
                disk_key.lora_uid,
            )
            self.disk.submit(block, data, ready, more=i != missing[-1])

    # --- locking: sizes count device tokens ------------------------------------------------

    def inc_lock_ref(self, node: TreeNode | None) -> None:
        while node is not None and node is not self.root_node:
            if node.lock_ref == 0 and node.value is not None:
                self._evictable_size -= len(node.key)
                self._protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode | None) -> None:
        while node is not None and node is not self.root_node:
            if node.lock_ref <= 0:
                raise RuntimeError("dec_lock_ref on a node that is not locked")
            if node.lock_ref == 1 and node.value is not None:
                self._evictable_size += len(node.key)
                self._protected_size -= len(node.key)
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._offer(node)
            node = node.parent

    # --- eviction --------------------------------------------------------------------------

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` device slots, least recently used first. A node whose
        KV is (or can be written) on the host stays in the tree, host-only; one that cannot
        goes with its host-only subtree."""
        freed: list[torch.Tensor] = []
        num_evicted = 0
        while num_evicted < num_tokens:
            node = self._lru.pop()
            if node is None:
                break
            if node.host_value is None:  # type: ignore[attr-defined]
                self._backup(node)
            freed.append(node.value)
            num_evicted += len(node.key)
            self._evictable_size -= len(node.key)
            self._emit("removed", node, "GPU")
            parent = node.parent
            assert parent is not None
            if node.host_value is not None:  # type: ignore[attr-defined]
                node.value = None
                self._offer(node)  # host-only now: a host leaf if childless
            else:
                node.value = None
                self._drop_subtree(node)
            if parent is not self.root_node:
                self._offer(parent)  # a device leaf if that was its last device child
        self._flush_backups()
        if freed:
            slots = torch.cat(freed)
            self.host_pool.cancel_restores(slots)
            self.token_to_kv_pool_allocator.free(slots)
        return num_evicted

    def _evictable_leaves(self) -> list[TreeNode]:
        """Unlocked device-resident nodes with no device-resident child."""
        leaves = []
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            if node.value is None:
                continue  # device nodes form a subtree from the root: nothing below
            device_children = [c for c in node.children.values() if c.value is not None]
            stack.extend(device_children)
            if not device_children and node.lock_ref == 0:
                leaves.append(node)
        return leaves

    def _offer(self, node: TreeNode) -> None:
        """Tell both tiers' heaps that `node` changed (see the module docstring)."""
        self._lru.offer(node)
        self._host_lru.offer(node)

    def _may_evict(self, node: TreeNode) -> bool:
        """Device-resident, unlocked, not the root: O(1), tested on every offer."""
        return node.value is not None and not node.lock_ref and node is not self.root_node

    def _device_leaf(self, node: TreeNode) -> bool:
        """A device eviction candidate: `_may_evict` and no device-resident child (tested as
        a candidate comes up, not on every offer: a shared prefix has many children)."""
        return self._may_evict(node) and not any(
            c.value is not None for c in node.children.values()
        )

    def _host_leaf(self, node: TreeNode) -> bool:
        """A host eviction candidate: host-only, unlocked, childless, not the root."""
        return (
            node.value is None
            and not node.lock_ref
            and not node.children
            and node is not self.root_node
        )

    def _drop_subtree(self, node: TreeNode) -> None:
        """Remove a node whose device KV is already freed, and its host-only descendants."""
        parent = node.parent
        assert parent is not None
        del parent.children[node.key[0]]
        stack = [node]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if n.host_value is not None:  # type: ignore[attr-defined]
                self._emit("removed", n, "CPU")
                self._free_host(n)

    # --- the host tier ---------------------------------------------------------------------

    def _backup(self, node: TreeNode) -> bool:
        """Give a device-resident node host slots (the host's own LRU makes room) and queue
        its copy there for `_flush_backups`; False if the host is full."""
        host_slots = self._alloc_host(len(node.key))
        if host_slots is None:
            return False
        self._queued_backups.append((node.value, host_slots))
        node.host_value = host_slots  # type: ignore[attr-defined]
        self.counters.written["host"] += len(node.key) * self.host_pool.bytes_per_token
        self._emit("stored", node, "CPU")
        return True

    def _flush_backups(self) -> None:
        """Copy every queued node to the host in one go (one gather per buffer, not one per
        node); before the device slots are freed, so the copy reads them first."""
        if not self._queued_backups:
            return
        device, host = zip(*self._queued_backups, strict=True)
        self._queued_backups = []
        self.host_pool.backup(torch.cat(device), torch.cat(host))

    def _alloc_host(self, n: int) -> torch.Tensor | None:
        pool = self.host_pool
        if pool.available_size() < n:
            self._evict_host(n - pool.available_size())
        return pool.allocator.alloc(n)

    def _evict_host(self, num_tokens: int) -> None:
        """Drop least recently used host-only leaves no request locks (a node being backed up
        still has its device slots: never one of them)."""
        # a queued back-up's slots may be dropped and handed out again here: its copy goes first
        self._flush_backups()
        num_evicted = 0
        while num_evicted < num_tokens:
            node = self._host_lru.pop()
            if node is None:
                break
            parent = node.parent
            assert parent is not None
            self._emit("removed", node, "CPU")
            del parent.children[node.key[0]]
            num_evicted += len(node.key)
            self._free_host(node)
            if parent is not self.root_node:
                self._offer(parent)  # a host leaf if that was its last child

    def _host_leaves(self) -> list[TreeNode]:
        leaves = []
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node.lock_ref == 0 and node.value is None:
                leaves.append(node)
        return leaves

    def _free_host(self, node: TreeNode) -> None:
        slots = node.host_value  # type: ignore[attr-defined]
        self.counters.dropped["host"] += slots.numel() * self.host_pool.bytes_per_token
        self.host_pool.allocator.free(slots)
        node.host_value = None  # type: ignore[attr-defined]

    # --- sizes and reports -----------------------------------------------------------------

    def host_size(self) -> int:
        """Host slots the tree holds."""
        return self.host_pool.used_size()

    def all_values(self) -> torch.Tensor:
        values = []
        stack = [self.root_node]
        while stack:
            node = stack.pop()
            if node.value is not None:
                values.append(node.value)
            stack.extend(node.children.values())
        return torch.cat(values)

    def all_host_values(self) -> torch.Tensor:
        """Every host slot the tree holds (for checks)."""
        values = [empty_slots()]
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            if node.host_value is not None:  # type: ignore[attr-defined]
                values.append(node.host_value)  # type: ignore[attr-defined]
            stack.extend(node.children.values())
        return torch.cat(values)

    def close(self) -> None:
        """At shutdown: the disk tier writes what it has queued, so a restart finds it."""
        if self.disk is not None:
            self.disk.close()

    def tier_report(self) -> dict:
        """Usage and bytes moved per tier since the last report, and restore latencies."""
        counters, self.counters = self.counters, TierCounters()
        usage = {"host": self.host_pool.used_size() / max(self.host_pool.size, 1)}
        if self.disk is not None:
            written, dropped = self.disk.bytes_written, self.disk.bytes_dropped
            seen_written, seen_dropped = self._disk_bytes_seen
            self._disk_bytes_seen = (written, dropped)
            counters.written["disk"] = written - seen_written
            counters.dropped["disk"] = dropped - seen_dropped
            usage["disk"] = self.disk.used_bytes() / max(self.disk.max_bytes, 1)
        return {
            "usage": usage,
            "written": counters.written,
            "restored": counters.restored,
            "dropped": counters.dropped,
            "restore_seconds": self.host_pool.pop_restore_seconds(),
        }


def build_tiered_cache(
    server_args: ServerArgs,
    req_to_token_pool: ReqToTokenPool,
    allocator: TokenSlotAllocator,
    kv_pool: object,
) -> TieredRadixCache:
    """The cache `--kv-host-memory` (and `--kv-disk-path`) ask for, over the device `kv_pool`."""
    assert server_args.kv_host_memory is not None
    available = available_memory_bytes()
    if server_args.kv_host_memory * GB > available:
        raise ValueError(
            f"--kv-host-memory {server_args.kv_host_memory:g} GB is more than the "
            f"{available / GB:.1f} GB of host memory this process can still take"
        )
    host = HostKVPool(kv_pool, HostKVPool.slots_for_bytes(kv_pool, server_args.kv_host_memory * GB))
    logger.info(
        "host KV tier: %d tokens (%.1f GB, %s)",
        host.size,
        server_args.kv_host_memory,
        server_args.kv_write_policy,
    )
    disk = None
    if server_args.kv_disk_path is not None:
        fingerprint = fingerprint_of(
            model=server_args.model,
            random_seed=server_args.random_seed
            if server_args.model.startswith("random:")
            else None,
            quantization=server_args.quantization,
            layout=[[list(b.shape[1:]), str(b.dtype)] for b in kv_buffers(kv_pool)],
            block_tokens=BLOCK_TOKENS,
        )
        disk = DiskKVStore(
            server_args.kv_disk_path, int(server_args.kv_disk_size * GB), fingerprint
        )
    return TieredRadixCache(req_to_token_pool, allocator, host, server_args.kv_write_policy, disk)
