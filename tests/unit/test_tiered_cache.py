"""The three-tier radix cache (device, host, disk) under a hypothesis state machine.

Every token's KV in the test pool is a value computed from its whole prefix (as a model's is),
so a slot served from any tier can be checked against what recomputation would write. Rules:
requests run (match, restore, lock, compute the rest, finish), device eviction (writing back
to the host), a restart of the worker over the same disk directory. Invariants: no slot is
both free and held, or held twice; a node lives on the device, the host or both, and each
copy holds the right values; device nodes form a subtree from the root; sizes add up.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import zlib

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from tests.unit.test_radix_cache import FakeReq

from radixserve.mem_cache.allocator import TokenSlotAllocator
from radixserve.mem_cache.base_prefix_cache import adapter_key, split_adapter_key
from radixserve.mem_cache.disk_store import (
    STALE_TMP_SECONDS,
    DiskBlock,
    DiskKVStore,
    fingerprint_of,
)
from radixserve.mem_cache.host_pool import HostKVPool
from radixserve.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixserve.mem_cache.tiered_cache import TieredRadixCache

DEVICE_SLOTS = 24
HOST_SLOTS = 40
ROWS = 3
CONTEXT = 24
BLOCK = 4


# the adapters the machine's requests may run under, by uid: 7 and 8 are the same weights
# (a reload), 9 other weights; 10's weights are not read yet (no identity: no disk)
IDENTITIES = {7: b"weights-a", 8: b"weights-a", 9: b"weights-b"}


def kv_of(prefix: list[int], lora_uid: int = 0) -> float:
    """The 'KV' of the last token of `prefix` under an adapter: a function of the whole prefix
    and of the adapter's weights, exact in fp32."""
    weights = IDENTITIES.get(lora_uid, str(lora_uid).encode()) if lora_uid else b""
    return float(zlib.crc32(bytes(prefix) + weights) % (1 << 20))


class DiskLedger:
    """An event sink that follows the disk tier's blocks (DISK) as a consumer would: each
    whole block of a stored range is added, each removed one dropped; a block stored twice
    or removed while not held is an error (kept: the writer thread's exceptions are logged)."""

    def __init__(self) -> None:
        self.held: set[tuple[int, ...]] = set()
        self.errors: list[str] = []

    def stored(self, token_ids, start, medium) -> None:
        if medium == "DISK":
            for end in range(start + BLOCK, len(token_ids) + 1, BLOCK):
                if tuple(token_ids[:end]) in self.held:
                    self.errors.append(f"stored twice: {token_ids[:end]}")
                self.held.add(tuple(token_ids[:end]))

    def removed(self, token_ids, start, medium) -> None:
        if medium == "DISK":
            if tuple(token_ids) not in self.held:
                self.errors.append(f"removed, not held: {token_ids}")
            self.held.discard(tuple(token_ids))

    def cleared(self) -> None:
        self.held.clear()


class TieredCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.disk_dir = tempfile.mkdtemp(prefix="kvdisk-")
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        self.kv_pool = TokenToKVPool(DEVICE_SLOTS, 1, 1, 2, torch.float32, "cpu")
        self.req_pool = ReqToTokenPool(ROWS, CONTEXT, "cpu")
        self.allocator = TokenSlotAllocator(DEVICE_SLOTS)
        self.host = HostKVPool(self.kv_pool, HOST_SLOTS)
        fp = fingerprint_of(model="test", block=BLOCK)
        self.disk = DiskKVStore(self.disk_dir, 10 * BLOCK * 16 * 4, fp, block_tokens=BLOCK)
        self.cache = TieredRadixCache(
            self.req_pool, self.allocator, self.host, "write_back", self.disk
        )
        self.cache.adapter_identity = IDENTITIES.get
        self.ledger = DiskLedger()
        self.cache.event_sink = self.ledger  # a restart reports the blocks it finds
        self.running: list[FakeReq] = []

    def teardown(self) -> None:
        self.disk.close()
        shutil.rmtree(self.disk_dir, ignore_errors=True)

    # --- the scheduler's steps ---------------------------------------------------------------

    def _write_kv(self, slots: torch.Tensor, tokens: list[int], start: int, uid: int) -> None:
        values = torch.tensor([kv_of(tokens[: start + i + 1], uid) for i in range(slots.numel())])
        k = values.view(-1, 1, 1).expand(-1, 1, 2).contiguous()
        self.kv_pool.set_kv_buffer(0, slots, k, -k)

    @rule(
        tokens=st.lists(st.integers(0, 2), min_size=2, max_size=CONTEXT),
        finish=st.booleans(),
        evict_between=st.integers(0, DEVICE_SLOTS),
        lora_uid=st.sampled_from([0, 0, 7, 8, 9, 10]),
    )
    def run_request(
        self, tokens: list[int], finish: bool, evict_between: int = 0, lora_uid: int = 0
    ) -> None:
        """As an admission round and its pass: restore (the copies queued), maybe evictions
        for later requests of the round (`evict_between`, which may take restored nodes
        again), lock, take slots, write the new tokens' KV, then issue the copies (the launch;
        issued after the pass's own writes here, the worst order a device could run them in),
        then check the prefix. Under an adapter (`lora_uid`) the keys and the KV are its own."""
        rows = self.req_pool.alloc(1)
        if rows is None:
            return
        key = adapter_key(tokens[:-1], lora_uid)
        match = self.cache.match_prefix(key)
        if match.restorable:
            restored = self.cache.restore(key)
            assert sum(restored.values()) in (0, match.restorable)
            match = self.cache.match_prefix(key)
            if sum(restored.values()):
                assert match.restorable == 0
            if evict_between:
                self.cache.evict(evict_between)
                match = self.cache.match_prefix(key)
        prefix = match.indices
        self.cache.inc_lock_ref(match.last_node)
        need = len(tokens) - prefix.numel()
        if self.allocator.available_size() < need:
            self.cache.evict(need - self.allocator.available_size())
        new = self.allocator.alloc(need)
        if new is None:
            self.cache.dec_lock_ref(match.last_node)
            self.req_pool.free(rows)
            assert self.cache.take_restore() is None  # the next launch issues them (CPU: now)
            return
        self._write_kv(new, tokens, prefix.numel(), lora_uid)
        assert self.cache.take_restore() is None  # on the CPU the copies are done on return
        self._check_values(prefix, tokens, 0, lora_uid)
        self.req_pool.write(rows[0], 0, torch.cat([prefix, new]))
        req = FakeReq(
            rows[0],
            tokens,
            kv_len=len(tokens),
            prefix_indices=prefix,
            last_node=match.last_node,
            lora_uid=lora_uid,
        )
        if finish:
            self.cache.cache_finished_req(req)
            self.disk.flush()
        else:
            self.running.append(req)

    @rule(i=st.integers(0, ROWS - 1))
    def finish_running(self, i: int) -> None:
        if self.running:
            req = self.running.pop(i % len(self.running))
            self.cache.cache_finished_req(req)
            self.disk.flush()

    @rule(n=st.integers(1, DEVICE_SLOTS))
    def evict(self, n: int) -> None:
        self.cache.evict(n)

    @rule(
        tokens=st.lists(st.integers(0, 2), min_size=1, max_size=CONTEXT),
        lora_uid=st.sampled_from([0, 7]),
    )
    def match_only(self, tokens: list[int], lora_uid: int) -> None:
        """A waiting request's match that admission does not take up (LPM orders the whole
        queue): it touches the nodes it walks, and may split one, and locks nothing."""
        self.cache.match_prefix(adapter_key(tokens, lora_uid))

    @rule()
    def restart(self) -> None:
        """A new worker over the same disk directory: only the disk tier survives."""
        for req in self.running:
            self.cache.release_req(req)
        self.disk.close()
        self.restarts += 1
        self._start()

    # --- invariants ------------------------------------------------------------------------

    def _check_values(
        self, slots: torch.Tensor, tokens: list[int], start: int, lora_uid: int = 0
    ) -> None:
        if slots.numel() == 0:
            return
        k, v = self.kv_pool.read_kv(0, slots, torch.float32)
        want = torch.tensor(
            [kv_of(tokens[: start + i + 1], lora_uid) for i in range(slots.numel())]
        )
        assert torch.equal(k[:, 0, 0], want), "a served slot holds another prefix's KV"
        assert torch.equal(v[:, 0, 1], -want)

    @invariant()
    def disk_events_match_the_files(self) -> None:
        """Every block a consumer holds as DISK is on disk (a block whose parent went before
        a restart is on disk but not reported: its hash needs its whole prefix)."""
        self.disk.flush()
        assert not self.ledger.errors
        names = set()
        for path in self.ledger.held:
            lora_uid, tokens = split_adapter_key(path)
            names.add(self.disk.block_names(tokens, IDENTITIES.get(lora_uid, b""))[-1])
        assert names <= set(self.disk._index)

    @invariant()
    def slots_add_up(self) -> None:
        cache = self.cache
        held = cache.all_values()
        own = [
            self.req_pool.read(r.req_pool_idx, r.kv_len)[r.prefix_indices.numel() :]
            for r in self.running
        ]
        everything = torch.cat([held, self.allocator.free_slots(), *own])
        assert everything.numel() == DEVICE_SLOTS, "a device slot leaked or is held twice"
        assert torch.unique(everything).numel() == DEVICE_SLOTS
        host_held = cache.all_host_values()
        host_all = torch.cat([host_held, self.host.allocator.free_slots()])
        assert host_all.numel() == HOST_SLOTS and torch.unique(host_all).numel() == HOST_SLOTS
        assert cache.host_size() == host_held.numel()
        assert cache.evictable_size() + cache.protected_size() == held.numel()

    @invariant()
    def every_candidate_is_in_its_heap(self) -> None:
        """Each tier's eviction candidates, found by a walk of the tree, have an entry in that
        tier's heap under their current access time: what makes eviction from the heaps take
        exactly what a walk would, in its order."""
        cache = self.cache
        for heap, candidates in (
            (cache._lru, cache._evictable_leaves()),
            (cache._host_lru, cache._host_leaves()),
        ):
            for node in candidates:
                assert heap.entered(node), "a candidate left out"

    @invariant()
    def nodes_are_placed_and_exact(self) -> None:
        cache = self.cache
        protected = 0
        stack = [(child, []) for child in cache.root_node.children.values()]
        while stack:
            node, above = stack.pop()
            path = above + node.key
            start = len(above)
            lora_uid, tokens = split_adapter_key(path)
            assert node.value is not None or node.host_value is not None, "a node with no KV"
            if node.value is not None:
                assert node.parent is cache.root_node or node.parent.value is not None
                self._check_values(node.value, list(tokens), start, lora_uid)
                if node.lock_ref:
                    protected += len(node.key)
            if node.host_value is not None:
                data = self.host.read(node.host_value).view(torch.float32)
                want = torch.tensor(
                    [kv_of(list(tokens[: start + i + 1]), lora_uid) for i in range(len(node.key))]
                )
                assert torch.equal(data[:, 0], want), "a host copy holds another prefix's KV"
            stack.extend((c, path) for c in node.children.values())
        assert protected == cache.protected_size()


TestTieredCache = TieredCacheMachine.TestCase
TestTieredCache.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_a_host_hit_is_restored_and_counted() -> None:
    machine = TieredCacheMachine()
    try:
        machine.run_request([1, 2, 1, 2, 1, 2, 1, 2, 0], finish=True)
        machine.cache.evict(DEVICE_SLOTS)  # everything to the host
        assert machine.cache.evictable_size() == 0 and machine.cache.host_size() == 9
        match = machine.cache.match_prefix([1, 2, 1, 2, 1, 2, 1])
        assert match.indices.numel() == 0 and match.restorable == 7
        assert machine.cache.restore([1, 2, 1, 2, 1, 2, 1]) == {"host": 7, "disk": 0}
        machine.cache.take_restore()
        machine._check_values(
            machine.cache.match_prefix([1, 2, 1, 2, 1, 2, 1]).indices, [1, 2, 1, 2, 1, 2, 1], 0
        )
        report = machine.cache.tier_report()
        assert report["restored"]["host"] == 7 * machine.host.bytes_per_token
    finally:
        machine.teardown()


def test_a_restart_finds_disk_blocks_and_ignores_corrupt_ones() -> None:
    machine = TieredCacheMachine()
    try:
        tokens = [0, 1, 2, 0, 1, 2, 0, 1, 2, 2]
        machine.run_request(tokens, finish=True)
        machine.restart()
        key = tokens[:-1]
        assert machine.cache.match_prefix(key).restorable == 8  # two whole blocks of 4
        # corrupt the second block: the first is served, the second deleted
        names = machine.disk.block_names(key)
        path = machine.disk.dir / f"{names[1]}.kv"
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF
        path.write_bytes(bytes(raw))
        assert machine.cache.restore(key) == {"host": 0, "disk": 4}
        machine.cache.take_restore()
        assert not path.exists()
        machine._check_values(machine.cache.match_prefix(key).indices, key, 0)
    finally:
        machine.teardown()


def test_a_foreign_fingerprint_is_not_served(tmp_path) -> None:
    pool = TokenToKVPool(8, 1, 1, 2, torch.float32, "cpu")
    data = torch.zeros((BLOCK, HostKVPool(pool, 4).bytes_per_token), dtype=torch.uint8)
    mine = DiskKVStore(tmp_path, 1 << 20, fingerprint_of(model="a"), block_tokens=BLOCK)
    names = mine.block_names([1, 2, 3, 4])
    mine.submit(DiskBlock(names[0], mine.fingerprint, [1, 2, 3, 4]), data)
    mine.close()
    other = DiskKVStore(tmp_path, 1 << 20, fingerprint_of(model="b"), block_tokens=BLOCK)
    assert not other.contains(names[0])
    # even a file copied into its directory is refused: the fingerprint inside is checked
    shutil.copy(mine.dir / f"{names[0]}.kv", other.dir / f"{names[0]}.kv")
    assert other.read(names[0], other.fingerprint, [1, 2, 3, 4]) is None
    other.close()


def test_host_slots_split_into_runs_of_consecutive_slots() -> None:
    from radixserve.mem_cache.host_pool import _runs

    assert _runs(torch.tensor([4, 5, 6, 9, 2, 3], dtype=torch.int64)) == [
        (0, 4, 3),
        (3, 9, 1),
        (4, 2, 2),
    ]
    assert _runs(torch.empty(0, dtype=torch.int64)) == []


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_write_policies_keep_evicted_prefixes(policy: str) -> None:
    kv_pool = TokenToKVPool(8, 1, 1, 2, torch.float32, "cpu")
    req_pool = ReqToTokenPool(1, 8, "cpu")
    allocator = TokenSlotAllocator(8)
    host = HostKVPool(kv_pool, 16)
    cache = TieredRadixCache(req_pool, allocator, host, policy)
    row = req_pool.alloc(1)[0]
    slots = allocator.alloc(6)
    req_pool.write(row, 0, slots)
    cache.cache_finished_req(FakeReq(row, [5, 6, 7, 8, 9, 10], kv_len=6))
    assert cache.host_size() == (6 if policy == "write_through" else 0)
    cache.evict(6)
    assert cache.host_size() == 6 and cache.evictable_size() == 0
    assert cache.match_prefix([5, 6, 7, 8, 9]).restorable == 5


class RecordingSink:
    """A KV event sink that keeps (kind, tokens, medium) of what it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, tuple[int, ...], str]] = []

    def stored(self, token_ids, start, medium) -> None:
        self.events.append(("stored", tuple(token_ids[start:]), medium))

    def removed(self, token_ids, start, medium) -> None:
        self.events.append(("removed", tuple(token_ids[start:]), medium))

    def cleared(self) -> None:
        self.events.append(("cleared", (), ""))


def test_the_event_sink_sees_pages_move_between_tiers() -> None:
    kv_pool = TokenToKVPool(8, 1, 1, 2, torch.float32, "cpu")
    req_pool = ReqToTokenPool(1, 8, "cpu")
    allocator = TokenSlotAllocator(8)
    sink = RecordingSink()
    cache = TieredRadixCache(req_pool, allocator, HostKVPool(kv_pool, 16), event_sink=sink)
    row = req_pool.alloc(1)[0]
    req_pool.write(row, 0, allocator.alloc(4))
    cache.cache_finished_req(FakeReq(row, [5, 6, 7, 8], kv_len=4))
    cache.evict(4)
    cache.restore([5, 6, 7, 8])
    assert sink.events == [
        ("stored", (5, 6, 7, 8), "GPU"),
        ("stored", (5, 6, 7, 8), "CPU"),  # written back just before the eviction
        ("removed", (5, 6, 7, 8), "GPU"),
        ("stored", (5, 6, 7, 8), "GPU"),  # restored: on both tiers again
    ]


class PathSink(RecordingSink):
    """Keeps (kind, whole token path, start, medium): a disk block's hash needs its prefix."""

    def stored(self, token_ids, start, medium) -> None:
        self.events.append(("stored", tuple(token_ids), start, medium))  # type: ignore[arg-type]

    def removed(self, token_ids, start, medium) -> None:
        self.events.append(("removed", tuple(token_ids), start, medium))  # type: ignore[arg-type]


def disk_events(sink: RecordingSink) -> list:
    return [e for e in sink.events if e[-1] in ("DISK", "")]


def test_the_disk_tier_reports_its_blocks_with_their_whole_prefix() -> None:
    """Written: stored DISK (after the GPU's stored; a chain of blocks as one range); a restart
    with a sink: the old blocks stored DISK; a flush: cleared, then the disk's blocks again (they stay); a
    corrupt file: removed DISK; the size limit: the oldest block removed DISK."""
    machine = TieredCacheMachine()
    try:
        sink = PathSink()
        machine.cache.event_sink = sink
        tokens = [0, 1, 2, 0, 1, 2, 0, 1, 2, 2]
        machine.run_request(tokens, finish=True)  # flushes the disk writer
        first, second = tuple(tokens[:4]), tuple(tokens[:8])
        assert sink.events[0] == ("stored", tuple(tokens), 0, "GPU")
        assert disk_events(sink) == [("stored", second, 0, "DISK")]

        machine.restart()
        sink = PathSink()
        machine.cache.event_sink = sink  # as the scheduler attaches the publisher
        machine.disk.flush()
        assert disk_events(sink) == [("stored", second, 0, "DISK")]

        sink.events.clear()
        machine.cache.reset()  # /flush_cache: the consumer drops all, the disk keeps its blocks
        machine.disk.flush()
        assert sink.events == [("cleared", (), ""), ("stored", second, 0, "DISK")]

        sink.events.clear()
        key = tokens[:-1]
        path = machine.disk.dir / f"{machine.disk.block_names(key)[1]}.kv"
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF
        path.write_bytes(bytes(raw))
        assert machine.cache.restore(key) == {"host": 0, "disk": 4}
        assert ("removed", second, 4, "DISK") in sink.events
        assert ("stored", first, 0, "CPU") in sink.events  # read into the host tier

        # the size limit: new blocks push the oldest out; per block, stored and removed
        # alternate (a block evicted may be written again), and what stays stored is on disk
        sink.events.clear()
        for n in range(12):
            machine.run_request([2, 2, 1, n % 3, 1, 0, n // 3, 2, 1], finish=True)
        assert ("removed", first, 0, "DISK") in sink.events
        state: dict[tuple[int, ...], bool] = {first: True}  # what the disk held before
        for kind, path, start, _ in disk_events(sink):
            for end in range(start + BLOCK, len(path) + 1, BLOCK):  # a stored range's blocks
                assert state.get(path[:end], False) == (kind == "removed")
                state[path[:end]] = kind == "stored"
        on_disk = {path for path, stored in state.items() if stored}
        names = {machine.disk.block_names(path)[-1] for path in on_disk}
        assert names == set(machine.disk._index)
        # the store keeps only reported blocks' links, and withdrawn ones while children need them
        gone = machine.disk._reported.keys() - machine.disk._index.keys()
        assert all(machine.disk._reported[n].children for n in gone)
    finally:
        machine.teardown()


def test_an_adapters_disk_blocks_are_found_by_its_weights_after_a_restart() -> None:
    """The disk names an adapter's blocks by the digest of its weights: after a restart (new
    uids) the same weights find them, other weights and the base model do not, and an adapter
    whose weights are not read yet neither reads nor writes the disk."""
    machine = TieredCacheMachine()
    try:
        tokens = [0, 1, 2, 0, 1, 2, 0, 1, 2, 2]
        machine.run_request(tokens, finish=True, lora_uid=7)
        machine.run_request(tokens, finish=True, lora_uid=10)  # no identity: not written
        assert len(machine.disk._index) == 2
        machine.restart()
        key = tokens[:-1]
        assert machine.cache.match_prefix(adapter_key(key, 8)).restorable == 8  # same weights
        assert machine.cache.match_prefix(adapter_key(key, 9)).restorable == 0
        assert machine.cache.match_prefix(key).restorable == 0
        assert machine.cache.match_prefix(adapter_key(key, 10)).restorable == 0
        assert machine.cache.restore(adapter_key(key, 8)) == {"host": 0, "disk": 8}
        machine.cache.take_restore()
        restored = machine.cache.match_prefix(adapter_key(key, 8)).indices
        machine._check_values(restored, key, 0, 8)
    finally:
        machine.teardown()


def test_workers_may_share_a_disk_directory(tmp_path) -> None:
    """Two stores over one directory (pods on one model-cache claim): a block one writes, the
    other finds at its start; a crashed writer's old temporary file goes, a live one's stays."""
    pool = TokenToKVPool(8, 1, 1, 2, torch.float32, "cpu")
    data = torch.arange(BLOCK * HostKVPool(pool, 4).bytes_per_token, dtype=torch.uint8)
    fp = fingerprint_of(model="a")
    first = DiskKVStore(tmp_path, 1 << 20, fp, block_tokens=BLOCK)
    stale, live = first.dir / "crashed.tmp", first.dir / "writing.tmp"
    stale.write_bytes(b"x")
    live.write_bytes(b"y")
    old = time.time() - STALE_TMP_SECONDS - 1
    os.utime(stale, (old, old))
    name = first.block_names([1, 2, 3, 4])[0]
    first.submit(DiskBlock(name, fp, [1, 2, 3, 4]), data.view(BLOCK, -1))
    first.flush()
    second = DiskKVStore(tmp_path, 1 << 20, fp, block_tokens=BLOCK)
    assert second.contains(name)
    assert torch.equal(second.read(name, fp, [1, 2, 3, 4]).flatten(), data)
    assert not stale.exists() and live.exists()
    first.close()
    second.close()


def small_tiered(host_slots: int) -> TieredRadixCache:
    """A write-back tiered cache of 16 device slots, without a disk tier."""
    kv_pool = TokenToKVPool(16, 1, 1, 2, torch.float32, "cpu")
    return TieredRadixCache(
        ReqToTokenPool(1, 16, "cpu"), TokenSlotAllocator(16), HostKVPool(kv_pool, host_slots)
    )


def put(cache: TieredRadixCache, tokens: list[int]) -> None:
    """A finished request's tokens into the tree (its duplicates of the tree's slots freed)."""
    allocator = cache.token_to_kv_pool_allocator
    slots = allocator.alloc(len(tokens))
    allocator.free(slots[: cache.insert(tokens, slots)])


def test_a_device_leaf_walked_past_into_the_host_stays_evictable() -> None:
    """A match through a device leaf into its host-only child touches both: the leaf must be
    entered again under its new time, or no eviction finds it."""
    cache = small_tiered(host_slots=16)
    put(cache, [1, 1, 1, 1])
    put(cache, [1, 1, 1, 1, 2, 2, 2, 2])
    assert cache.evict(4) == 4  # the child to the host: its parent is a device leaf now
    assert cache.match_prefix([1, 1, 1, 1, 2, 2, 2, 2]).restorable == 4
    assert cache.evict(4) == 4 and cache.evictable_size() == 0


def test_a_touched_host_leaf_goes_after_the_untouched_one() -> None:
    """Two host-only leaves fill the host; the older one is touched: making room for two new
    back-ups drops the untouched one first, then the touched one (not left out as stale)."""
    cache = small_tiered(host_slots=8)
    put(cache, [1, 1, 1, 1])
    put(cache, [2, 2, 2, 2])
    assert cache.evict(8) == 8 and cache.host_size() == 8
    cache.match_prefix([1, 1, 1, 1])
    put(cache, [3, 3, 3, 3])
    put(cache, [4, 4, 4, 4])
    # (each check matches only what must be gone: a match of a cached prefix touches it)
    cache.evict(4)  # [3, 3, 3, 3] backed up over [2, 2, 2, 2], the least recently used
    assert cache.match_prefix([2, 2, 2, 2]).restorable == 0
    cache.evict(4)  # [4, 4, 4, 4] over [1, 1, 1, 1]
    assert cache.match_prefix([1, 1, 1, 1]).restorable == 0
    assert [cache.match_prefix([t] * 4).restorable for t in (3, 4)] == [4, 4]


def test_a_leaf_inserted_again_stays_evictable() -> None:
    """A second request's tokens ending at a cached leaf touch it: entered again."""
    cache = small_tiered(host_slots=16)
    put(cache, [1, 1, 1, 1])
    put(cache, [1, 1, 1, 1])
    assert cache.evict(4) == 4


def test_a_node_touched_while_locked_is_evictable_once_unlocked() -> None:
    cache = small_tiered(host_slots=16)
    put(cache, [1, 1, 1, 1])
    node = cache.match_prefix([1, 1, 1, 1]).last_node
    cache.inc_lock_ref(node)
    cache.match_prefix([1, 1, 1, 1])  # another request's match: a new time, while locked
    assert cache.evict(4) == 0
    cache.dec_lock_ref(node)
    assert cache.evict(4) == 4


def test_a_host_only_parent_left_childless_is_dropped_in_the_same_pass() -> None:
    """A host-only chain (a prefix and its continuation) fills the host; a back-up that needs
    all of it drops the leaf, then its parent, which became a leaf on the way."""
    cache = small_tiered(host_slots=8)
    put(cache, [1, 1, 1, 1])
    put(cache, [1, 1, 1, 1, 2, 2, 2, 2])
    assert cache.evict(8) == 8 and cache.host_size() == 8
    put(cache, [3] * 8)
    assert cache.evict(8) == 8
    assert cache.match_prefix([3] * 8).restorable == 8  # backed up: the host made room
    assert cache.match_prefix([1, 1, 1, 1]).restorable == 0
