"""`LRUHeap`: a prefix tree's eviction candidates, least recently used first, kept as the tree
changes instead of gathered by a walk of the whole tree at each eviction.

A saturated server evicts at nearly every admission, and a walk costs the whole tree each time:
8 ms a call at 10,000 cached prompts and 101 ms at 50,000, 15 and 178 ms with the host tier
(scripts/radix_cache_costs.py, this repository's CPU, 2026-12-05), with the scheduler loop, and
the GPU behind it, waiting. Here the tree offers a node wherever it
may have become a candidate or was touched (`offer`): a cheap test (`may_be_candidate`) decides
whether it is entered, under its access time. Entries are never removed in place; they go stale
as their node is touched again, locked, grows a child or leaves the tree, and `pop` drops them
as they come up, testing the rest fully (`is_candidate`). When stale entries outnumber the live
ones the heap is rebuilt from a walk (`walk`): it stays within a few times the candidates
however long the server runs without evicting, and a walk comes once per more offers than
there are candidates, not once per eviction.

The caches (radix_cache.py, tiered_cache.py) own the rules of what a candidate is; this module
owns only the order and the staleness.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Protocol


class TreeNode(Protocol):
    """What the heap reads of a tree's node (radix_cache.TreeNode has it)."""

    parent: TreeNode | None
    children: dict[int, TreeNode]
    key: list[int]
    last_access_time: int
    id: int


# rebuilt when the heap holds more than twice the candidates of the last rebuild, plus this
REBUILD_SLACK = 4096
# an entry's low bits: the node's id (ids count up from 0, one a node made: 2**48 is beyond
# any server's life)
ID_BITS = 48
ID_MASK = (1 << ID_BITS) - 1


def in_tree(node: TreeNode, root: TreeNode) -> bool:
    """Whether `node` still hangs from `root`: each node on the way up is its parent's child.
    (A removed node keeps its parent pointer, and a node under a removed one its whole link.)"""
    while node is not root:
        parent = node.parent
        if parent is None or parent.children.get(node.key[0]) is not node:
            return False
        node = parent
    return True


class LRUHeap:
    """Candidates by (last access time, node id): see the module docstring.

    An entry is one int, the time above the id's `ID_BITS` bits, and the nodes are found by id
    in one dict: an entry is no object the cyclic garbage collector tracks (as tuples holding
    their node, a match at 50,000 cached prompts took 10.5 us against 6.5, and an eviction
    0.63 ms against 0.42: scripts/radix_cache_costs.py, this repository's CPU)."""

    def __init__(
        self,
        root: TreeNode,
        may_be_candidate: Callable[[TreeNode], bool],
        is_candidate: Callable[[TreeNode], bool],
        walk: Callable[[], Iterable[TreeNode]],
    ) -> None:
        self._root = root
        self._may_be_candidate = may_be_candidate
        self._is_candidate = is_candidate
        self._walk = walk
        self._heap: list[int] = []
        self._nodes: dict[int, TreeNode] = {}  # every node an entry names, by id
        self._rebuilt_size = 0

    def __len__(self) -> int:
        """Entries held, stale ones included."""
        return len(self._heap)

    def entered(self, node: TreeNode) -> bool:
        """Whether `node` has an entry under its current access time (what eviction needs of
        every candidate; a linear scan: for tests)."""
        want = _entry(node)
        return self._nodes.get(node.id) is node and want in self._heap

    def offer(self, node: TreeNode) -> None:
        """Enter `node` under its current access time if it may be a candidate now."""
        if not self._may_be_candidate(node):
            return
        self._nodes[node.id] = node
        heapq.heappush(self._heap, _entry(node))
        if len(self._heap) > 2 * self._rebuilt_size + REBUILD_SLACK:
            self.rebuild()

    def pop(self) -> TreeNode | None:
        """The least recently used candidate, out of the heap; None when there is none. An
        entry counts only while its node is in the tree, untouched since it was entered and a
        candidate by the cache's full test."""
        heap = self._heap
        while heap:
            entry = heapq.heappop(heap)
            node = self._nodes[entry & ID_MASK]
            if (
                entry >> ID_BITS == node.last_access_time
                and in_tree(node, self._root)
                and self._is_candidate(node)
            ):
                return node
        return None

    def rebuild(self) -> None:
        """The heap from a walk of the tree: exactly its candidates, no stale entry."""
        self._nodes = {n.id: n for n in self._walk()}
        self._heap = [_entry(n) for n in self._nodes.values()]
        heapq.heapify(self._heap)
        self._rebuilt_size = len(self._heap)


def _entry(node: TreeNode) -> int:
    """A node's heap entry: ordered by access time, then id (the two never collide)."""
    return node.last_access_time << ID_BITS | node.id
