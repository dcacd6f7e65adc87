"""RadixCache: node splitting, LRU eviction, locking, the request lifecycle, and a stateful
random test that checks no KV slot is ever leaked or double-freed."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixserve.mem_cache.allocator import TokenSlotAllocator
from radixserve.mem_cache.memory_pool import ReqToTokenPool
from radixserve.mem_cache.radix_cache import RadixCache, TreeNode


@dataclass
class FakeReq:
    """The fields of the scheduler's Req that the cache reads and writes."""

    req_pool_idx: int
    origin_input_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    kv_len: int = 0
    prefix_indices: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    last_node: TreeNode | None = None
    lora_uid: int = 0


class RecordingAllocator(TokenSlotAllocator):
    """An allocator that logs every freed slot, so the test model can tell what was evicted."""

    def __init__(self, size: int) -> None:
        self.freed_log: list[int] = []
        super().__init__(size)

    def free(self, indices: torch.Tensor) -> None:
        self.freed_log.extend(indices.tolist())
        super().free(indices)


def make_cache(num_slots: int = 32, num_rows: int = 4, context: int = 16) -> RadixCache:
    pool = ReqToTokenPool(size=num_rows, max_context_len=context, device="cpu")
    return RadixCache(pool, RecordingAllocator(num_slots))


def slots(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def admit(cache: RadixCache, tokens: list[int], kv_len: int) -> FakeReq | None:
    """What the scheduler does at admission: match, lock, allocate the rest, write the row.

    Returns None (and undoes everything) when rows or slots run out even after eviction.
    """
    rows = cache.req_to_token_pool.alloc(1)
    if rows is None:
        return None
    match = cache.match_prefix(tokens[:kv_len])
    cache.inc_lock_ref(match.last_node)
    num_new = kv_len - len(match.indices)
    allocator = cache.token_to_kv_pool_allocator
    if allocator.available_size() < num_new:
        cache.evict(num_new - allocator.available_size())
    new_slots = allocator.alloc(num_new)
    if new_slots is None:
        cache.dec_lock_ref(match.last_node)
        cache.req_to_token_pool.free(rows[0])
        return None
    req = FakeReq(rows[0], list(tokens), kv_len=kv_len)
    req.prefix_indices = match.indices
    req.last_node = match.last_node
    cache.req_to_token_pool.write(req.req_pool_idx, 0, torch.cat((match.indices, new_slots)))
    return req


def own_slots(cache: RadixCache, req: FakeReq) -> list[int]:
    """The slots a live request holds outside the tree."""
    return cache.req_to_token_pool.read(req.req_pool_idx, req.kv_len)[
        len(req.prefix_indices) :
    ].tolist()


# --- plain unit tests -------------------------------------------------------------------------


def test_empty_cache_matches_nothing() -> None:
    cache = make_cache()
    match = cache.match_prefix([1, 2, 3])
    assert match.indices.numel() == 0 and match.indices.dtype == torch.int64
    assert match.last_node is cache.root_node
    assert cache.total_size() == 0 and not cache.disabled


def test_insert_reports_tokens_already_cached_and_keeps_their_slots() -> None:
    cache = make_cache()
    assert cache.insert([1, 2, 3], slots(10, 11, 12)) == 0
    assert cache.insert([1, 2, 5, 6], slots(20, 21, 22, 23)) == 2
    assert cache.insert([1, 2, 3], slots(30, 31, 32)) == 3
    assert cache.match_prefix([1, 2, 5, 6, 7]).indices.tolist() == [10, 11, 22, 23]
    assert cache.match_prefix([1, 2, 3]).indices.tolist() == [10, 11, 12]
    assert cache.total_size() == cache.evictable_size() == 5


def test_match_splits_a_node_so_last_node_ends_at_the_match() -> None:
    cache = make_cache()
    cache.insert([1, 2, 3, 4], slots(10, 11, 12, 13))
    match = cache.match_prefix([1, 2, 9])
    assert match.indices.tolist() == [10, 11]
    node = match.last_node
    assert node is not None and node.key == [1, 2] and node.value.tolist() == [10, 11]
    assert node.parent is cache.root_node
    (lower,) = node.children.values()
    assert lower.key == [3, 4] and lower.value.tolist() == [12, 13] and lower.parent is node
    assert cache.total_size() == 4
    assert cache.match_prefix([1, 2, 3, 4]).indices.tolist() == [10, 11, 12, 13]


def test_match_on_a_key_shorter_than_the_edge_splits_too() -> None:
    cache = make_cache()
    cache.insert([7, 8, 9], slots(1, 2, 3))
    match = cache.match_prefix([7])
    assert match.last_node is not None and match.last_node.key == [7]
    assert match.indices.tolist() == [1]


def test_evict_takes_least_recently_used_leaves_first() -> None:
    cache = make_cache()
    allocator = cache.token_to_kv_pool_allocator
    for key in ([1, 1], [2, 2], [3, 3]):
        value = allocator.alloc(2)
        assert value is not None
        cache.insert(key, value)
    kept = cache.match_prefix([1, 1]).indices
    second = cache.match_prefix([2, 2]).indices
    third = cache.match_prefix([3, 3]).indices
    for key in ([2, 2], [3, 3], [1, 1]):  # access order, oldest first
        cache.match_prefix(key)
    free_before = allocator.available_size()
    assert cache.evict(1) == 2
    assert cache.match_prefix([2, 2]).indices.numel() == 0
    assert set(second.tolist()) <= set(allocator.free_slots().tolist())
    assert allocator.available_size() == free_before + 2
    assert cache.evict(2) == 2
    assert cache.match_prefix([3, 3]).indices.numel() == 0
    assert set(third.tolist()) <= set(allocator.free_slots().tolist())
    assert cache.match_prefix([1, 1]).indices.tolist() == kept.tolist()


def test_evict_continues_with_a_parent_that_becomes_a_leaf() -> None:
    cache = make_cache()
    cache.insert([1, 2, 3], slots(1, 2, 3))
    cache.insert([1, 2, 4], slots(1, 2, 4))
    cache.insert([5], slots(5))
    cache.match_prefix([5])  # [5] is the most recent
    assert cache.evict(3) == 4
    assert cache.match_prefix([1, 2]).indices.numel() == 0
    assert cache.all_values().tolist() == [5]
    assert cache.total_size() == cache.evictable_size() == 1


def test_locked_leaves_are_never_evicted() -> None:
    cache = make_cache()
    cache.insert([1, 2, 3], slots(1, 2, 3))
    cache.insert([1, 2, 4, 5], slots(1, 2, 4, 5))
    locked = cache.match_prefix([1, 2, 3]).last_node
    cache.inc_lock_ref(locked)
    assert cache.protected_size() == 3 and cache.evictable_size() == 2
    assert cache.evict(100) == 2
    assert cache.match_prefix([1, 2, 3]).indices.tolist() == [1, 2, 3]
    assert cache.evict(100) == 0
    cache.dec_lock_ref(locked)
    assert cache.protected_size() == 0 and cache.evictable_size() == 3
    assert cache.evict(100) == 3
    assert cache.total_size() == 0


def test_lock_counts_are_shared_by_both_halves_of_a_split() -> None:
    cache = make_cache()
    cache.insert([1, 2, 3, 4], slots(1, 2, 3, 4))
    leaf = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.inc_lock_ref(leaf)
    upper = cache.match_prefix([1, 2]).last_node  # splits the locked edge
    assert upper is not None and upper.lock_ref == 1 and upper.key == [1, 2]
    assert cache.protected_size() == 4
    cache.dec_lock_ref(leaf)
    assert upper.lock_ref == 0
    assert cache.protected_size() == 0 and cache.evictable_size() == 4


def test_dec_lock_ref_on_an_unlocked_node_raises() -> None:
    cache = make_cache()
    cache.insert([1], slots(1))
    node = cache.match_prefix([1]).last_node
    with pytest.raises(RuntimeError):
        cache.dec_lock_ref(node)


def test_insert_rejects_mismatched_lengths() -> None:
    cache = make_cache()
    with pytest.raises(ValueError):
        cache.insert([1, 2], slots(1))


def test_cache_finished_req_frees_duplicates_and_the_row() -> None:
    cache = make_cache(num_slots=16)
    allocator = cache.token_to_kv_pool_allocator
    first = admit(cache, [1, 2, 3, 4], kv_len=4)
    assert first is not None
    second = admit(cache, [1, 2, 3, 9], kv_len=4)  # computes [1, 2, 3] again: nothing cached yet
    assert second is not None
    first_slots = own_slots(cache, first)
    second_slots = own_slots(cache, second)
    cache.cache_finished_req(first)
    assert cache.total_size() == 4
    cache.cache_finished_req(second)
    assert cache.req_to_token_pool.available_size() == 4
    # The tree kept the first request's [1, 2, 3]; the second's copies went back to the free list.
    assert cache.match_prefix([1, 2, 3, 9]).indices.tolist() == first_slots[:3] + second_slots[3:]
    assert set(second_slots[:3]) <= set(allocator.free_slots().tolist())
    assert cache.total_size() + allocator.available_size() == 16
    assert cache.protected_size() == 0


def test_admission_reuses_the_cached_prefix() -> None:
    cache = make_cache(num_slots=16)
    first = admit(cache, [4, 5, 6], kv_len=3)
    assert first is not None
    cached = own_slots(cache, first)
    cache.cache_finished_req(first)
    second = admit(cache, [4, 5, 6, 7], kv_len=4)
    assert second is not None
    assert second.prefix_indices.tolist() == cached
    assert cache.protected_size() == 3
    cache.cache_finished_req(second)
    assert cache.protected_size() == 0 and cache.total_size() == 4


def test_cache_unfinished_req_moves_the_lock_and_points_the_row_at_tree_slots() -> None:
    cache = make_cache(num_slots=16)
    allocator = cache.token_to_kv_pool_allocator
    other = admit(cache, [1, 2, 3], kv_len=3)
    assert other is not None
    req = admit(cache, [1, 2, 3, 4, 5, 6], kv_len=4)  # first chunk; [1, 2, 3] is a duplicate
    assert req is not None
    cache.cache_finished_req(other)
    tree_slots = cache.match_prefix([1, 2, 3]).indices.tolist()
    duplicates = own_slots(cache, req)[:3]
    old_node = req.last_node
    cache.cache_unfinished_req(req)
    assert set(duplicates) <= set(allocator.free_slots().tolist())
    row = cache.req_to_token_pool.read(req.req_pool_idx, 4).tolist()
    assert row[:3] == tree_slots
    assert req.prefix_indices.tolist() == row
    assert req.last_node is not old_node and req.last_node is not None
    assert req.last_node.lock_ref == 1
    assert cache.protected_size() == 4 and cache.evictable_size() == 0
    assert cache.req_to_token_pool.available_size() == 3  # the request keeps its row
    # Second chunk, then finish.
    more = allocator.alloc(2)
    assert more is not None
    cache.req_to_token_pool.write(req.req_pool_idx, 4, more)
    req.kv_len = 6
    cache.cache_finished_req(req)
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).indices.tolist() == row + more.tolist()
    assert cache.protected_size() == 0
    assert cache.total_size() + allocator.available_size() == 16


def test_reset_forgets_everything() -> None:
    cache = make_cache()
    cache.insert([1, 2], slots(1, 2))
    cache.inc_lock_ref(cache.match_prefix([1]).last_node)
    cache.reset()
    assert cache.total_size() == cache.protected_size() == cache.evictable_size() == 0
    assert cache.match_prefix([1, 2]).indices.numel() == 0
    assert cache.all_values().numel() == 0


def lru_reference(cache: RadixCache, num_tokens: int) -> list[int]:
    """The slots an eviction of `num_tokens` frees, in order, found the plain way (every
    unlocked leaf of the tree in a heap by access time, a parent left childless joining it),
    without changing the tree."""
    leaves, stack = [], list(cache.root_node.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if not node.children and node.lock_ref == 0:
            leaves.append(node)
    heap = [(n.last_access_time, n.id, n) for n in leaves]
    heapq.heapify(heap)
    gone: set[int] = set()
    freed: list[int] = []
    while len(freed) < num_tokens and heap:
        _, _, node = heapq.heappop(heap)
        gone.add(node.id)
        freed.extend(node.value.tolist())
        parent = node.parent
        assert parent is not None
        if (
            parent is not cache.root_node
            and parent.lock_ref == 0
            and all(c.id in gone for c in parent.children.values())
        ):
            heapq.heappush(heap, (parent.last_access_time, parent.id, parent))
    return freed


def test_eviction_order_survives_many_touches_and_the_heap_stays_bounded() -> None:
    """200 cached prompts, half of them touched 20,000 times without an eviction: the LRU heap
    is rebuilt rather than grown without end, and evictions still take the untouched prompts
    first, then the touched ones in the order of their last touch."""
    cache = make_cache(200 * 3 + 10, 4, 8)
    allocator = cache.token_to_kv_pool_allocator
    for i in range(200):
        cache.insert([i, 1, 2], allocator.alloc(3))
    for _ in range(200):
        for i in range(1, 200, 2):  # the odd prompts, again and again; the even ones never
            cache.match_prefix([i, 1, 2])
    assert len(cache._lru) <= 2 * 200 + 4096
    assert cache.evict(300) == 300

    def cached() -> set[int]:
        # (a miss matches nothing; a hit touches, so read after the evictions)
        return {i for i in range(200) if len(cache.match_prefix([i, 1, 2]).indices) == 3}

    assert cache.evict(150) == 150  # the 50 odd prompts touched first in the last round
    assert cached() == set(range(101, 200, 2))


# --- stateful random test ---------------------------------------------------------------------

NUM_SLOTS = 48
NUM_ROWS = 6
CONTEXT = 16
# A tiny vocabulary makes keys share prefixes, so matches, splits and duplicates happen often.
token_lists = st.lists(st.integers(0, 2), min_size=1, max_size=10)


class RadixCacheMachine(RuleBasedStateMachine):
    """Drives a RadixCache the way the scheduler does and checks it against a plain model.

    The model is `cached`: every cached prefix (a tuple of tokens) -> the KV slot of its last
    token. A radix tree is exactly a prefix-closed set of such entries.
    """

    def __init__(self) -> None:
        super().__init__()
        self.cache = make_cache(NUM_SLOTS, NUM_ROWS, CONTEXT)
        allocator = self.cache.token_to_kv_pool_allocator
        assert isinstance(allocator, RecordingAllocator)
        self.allocator = allocator
        self.reqs: list[FakeReq] = []
        self.locks: list[TreeNode] = []  # locks taken by the test itself (not by requests)
        self.cached: dict[tuple[int, ...], int] = {}

    # -- model helpers

    def _record_insert(self, key: list[int], value: list[int]) -> int:
        already = 0
        while already < len(key) and tuple(key[: already + 1]) in self.cached:
            already += 1
        for i in range(already, len(key)):
            self.cached[tuple(key[: i + 1])] = value[i]
        return already

    def _expected_match(self, key: list[int]) -> list[int]:
        matched = []
        for i in range(len(key)):
            slot = self.cached.get(tuple(key[: i + 1]))
            if slot is None:
                break
            matched.append(slot)
        return matched

    def _forget_evicted(self) -> None:
        """Drop model entries whose slot was freed since the freed log was last cleared."""
        freed = set(self.allocator.freed_log)
        self.cached = {k: v for k, v in self.cached.items() if v not in freed}

    def _pick(self, items: list, index: int):  # type: ignore[no-untyped-def]
        return items[index % len(items)]

    # -- rules

    @rule(tokens=token_lists, chunk=st.integers(0, 10))
    def admit_request(self, tokens: list[int], chunk: int) -> None:
        kv_len = min(len(tokens), chunk)
        expected_prefix = self._expected_match(tokens[:kv_len])
        self.allocator.freed_log.clear()
        req = admit(self.cache, tokens, kv_len)
        self._forget_evicted()  # admission may have evicted (never the prefix it locked)
        if req is None:
            return
        assert req.prefix_indices.tolist() == expected_prefix
        self.reqs.append(req)

    @rule(tokens=token_lists)
    def insert_fresh_slots(self, tokens: list[int]) -> None:
        value = self.allocator.alloc(len(tokens))
        if value is None:
            return
        expected_already = self._record_insert(tokens, value.tolist())
        already = self.cache.insert(tokens, value)
        assert already == expected_already
        self.allocator.free(value[:already])  # duplicates of what the tree had

    @rule(tokens=token_lists)
    def match(self, tokens: list[int]) -> None:
        result = self.cache.match_prefix(tokens)
        assert result.indices.tolist() == self._expected_match(tokens)
        node = result.last_node
        assert node is not None
        path_len = 0
        while node is not self.cache.root_node:
            path_len += len(node.key)
            node = node.parent
        assert path_len == len(result.indices)

    @rule(tokens=token_lists)
    def lock(self, tokens: list[int]) -> None:
        node = self.cache.match_prefix(tokens).last_node
        assert node is not None
        self.cache.inc_lock_ref(node)
        self.locks.append(node)

    @precondition(lambda self: self.locks)
    @rule(index=st.integers(0, 50))
    def unlock(self, index: int) -> None:
        node = self.locks.pop(index % len(self.locks))
        self.cache.dec_lock_ref(node)

    @rule(num_tokens=st.integers(0, NUM_SLOTS))
    def evict(self, num_tokens: int) -> None:
        evictable_before = self.cache.evictable_size()
        protected_before = self.cache.protected_size()
        free_before = self.allocator.available_size()
        self.allocator.freed_log.clear()
        expected_order = lru_reference(self.cache, num_tokens)
        evicted = self.cache.evict(num_tokens)
        # exactly the leaves a walk of the whole tree would pick, in the same order: the heap
        # kept as the tree changes misses no leaf that became evictable and no touch
        assert self.allocator.freed_log == expected_order
        assert evicted >= min(num_tokens, evictable_before)
        assert evicted <= evictable_before
        assert self.allocator.available_size() == free_before + evicted
        assert self.cache.protected_size() == protected_before
        self._forget_evicted()

    @precondition(lambda self: self.reqs)
    @rule(index=st.integers(0, 50), extra=st.lists(st.integers(0, 2), min_size=1, max_size=4))
    def extend_request(self, index: int, extra: list[int]) -> None:
        """The next prefill chunk or decode tokens: allocate slots and grow kv_len."""
        req: FakeReq = self._pick(self.reqs, index)
        all_ids = req.origin_input_ids + req.output_ids
        num_new = len(extra)
        if req.kv_len + num_new > CONTEXT:
            return
        new_slots = self.allocator.alloc(num_new)
        if new_slots is None:
            return
        missing = req.kv_len + num_new - len(all_ids)
        if missing > 0:
            req.output_ids.extend(extra[:missing])
        self.cache.req_to_token_pool.write(req.req_pool_idx, req.kv_len, new_slots)
        req.kv_len += num_new

    @precondition(lambda self: self.reqs)
    @rule(index=st.integers(0, 50))
    def cache_unfinished(self, index: int) -> None:
        req: FakeReq = self._pick(self.reqs, index)
        key = (req.origin_input_ids + req.output_ids)[: req.kv_len]
        row = self.cache.req_to_token_pool.read(req.req_pool_idx, req.kv_len).tolist()
        self._record_insert(key, row)
        self.cache.cache_unfinished_req(req)
        assert req.prefix_indices.tolist() == self._expected_match(key)
        assert len(req.prefix_indices) == req.kv_len
        assert self.cache.req_to_token_pool.read(req.req_pool_idx, req.kv_len).tolist() == (
            req.prefix_indices.tolist()
        )

    @precondition(lambda self: self.reqs)
    @rule(index=st.integers(0, 50))
    def finish(self, index: int) -> None:
        req: FakeReq = self.reqs.pop(index % len(self.reqs))
        key = (req.origin_input_ids + req.output_ids)[: req.kv_len]
        row = self.cache.req_to_token_pool.read(req.req_pool_idx, req.kv_len).tolist()
        self._record_insert(key, row)
        self.cache.cache_finished_req(req)
        assert self.cache.match_prefix(key).indices.tolist() == self._expected_match(key)

    # -- invariants

    @invariant()
    def every_evictable_leaf_is_in_the_heap(self) -> None:
        """Under its current access time: what makes eviction from the heap take exactly what
        a walk of the tree would, in its order (the evict rule checks that order too)."""
        for node in self.cache._evictable_leaves():
            assert self.cache._lru.entered(node), "an evictable leaf left out"

    @invariant()
    def no_slot_leaked_or_double_freed(self) -> None:
        self.allocator.check_no_duplicates()
        free = self.allocator.free_slots().tolist()
        in_tree = self.cache.all_values().tolist()
        held = [s for req in self.reqs for s in own_slots(self.cache, req)]
        everything = free + in_tree + held
        assert len(everything) == len(set(everything)), "a slot is in two places"
        assert set(everything) == set(range(1, NUM_SLOTS + 1)), "a slot leaked"

    @invariant()
    def sizes_are_exact(self) -> None:
        total = self.cache.total_size()
        assert self.cache.evictable_size() + self.cache.protected_size() == total
        assert total == self.cache.all_values().numel() == len(self.cached)
        if not self.reqs and not self.locks:
            assert self.cache.protected_size() == 0
            assert self.cache.evictable_size() + self.allocator.available_size() == NUM_SLOTS

    @invariant()
    def tree_matches_the_model(self) -> None:
        in_tree: dict[tuple[int, ...], int] = {}
        stack: list[tuple[TreeNode, tuple[int, ...]]] = [(self.cache.root_node, ())]
        while stack:
            node, prefix = stack.pop()
            for i, (token, slot) in enumerate(zip(node.key, node.value.tolist(), strict=True)):
                in_tree[prefix + tuple(node.key[: i + 1])] = slot
                assert token == node.key[i]
            for first_token, child in node.children.items():
                assert child.parent is node and child.key and child.key[0] == first_token
                stack.append((child, prefix + tuple(node.key)))
        assert in_tree == self.cached

    @invariant()
    def lock_refs_count_the_holders_below(self) -> None:
        holders = self.locks + [req.last_node for req in self.reqs if req.last_node is not None]
        expected: dict[int, int] = {}
        for node in holders:
            while node is not self.cache.root_node:
                expected[node.id] = expected.get(node.id, 0) + 1
                node = node.parent
        protected = 0
        stack = list(self.cache.root_node.children.values())
        while stack:
            node = stack.pop()
            assert node.lock_ref == expected.get(node.id, 0)
            if node.lock_ref > 0:
                protected += len(node.key)
            stack.extend(node.children.values())
        assert protected == self.cache.protected_size()

    @invariant()
    def live_rows_hold_only_live_slots(self) -> None:
        free = set(self.allocator.free_slots().tolist())
        for req in self.reqs:
            row = self.cache.req_to_token_pool.read(req.req_pool_idx, req.kv_len).tolist()
            assert row[: len(req.prefix_indices)] == req.prefix_indices.tolist()
            assert not free & set(row), "a running request's row points at a free slot"


RadixCacheMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
test_radix_cache_state_machine = RadixCacheMachine.TestCase
