"""An approximate radix tree of what the router sent each worker, bounded per worker, LRU-evicted.

The router cannot see a worker's KV cache, but it knows every prompt it sent there: a prompt
sent to a worker recently is likely still cached by that worker's radix cache. So one tree over
prompt text holds, per node, the workers ("tenants") that were sent that prefix and when (a
logical clock: each insert is one tick). Matching a new prompt walks the tree once and yields,
for every worker, the length of its longest prefix of the prompt.

Sizes are counted in characters per tenant; a tenant over its bound loses its least recently
used leaves until it is under 90% of the bound again (eviction has to scan the tenant's leaves,
so it runs once per ~10% of growth, not per insert). A node no tenant holds is removed.
Invariant: a node's tenants are a subset of its parent's, and a tenant's clock on a node is at
most its clock on the parent (inserts stamp the whole path), so leaves are always the oldest.
This is SGLang's router tree (sgl-router, `cache_aware`), written for one event loop.
"""

from __future__ import annotations

import heapq
from collections import defaultdict

EVICT_TO = 0.9


def common_prefix_length(a: str, b: str) -> int:
    """Length of the common prefix, by halving slices: the comparisons run at C speed."""
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while high - low > 1:  # a[:low] == b[:low] and a[:high] != b[:high]
        mid = (low + high) // 2
        if a[low:mid] == b[low:mid]:
            low = mid
        else:
            high = mid
    return low


class _Node:
    __slots__ = ("text", "parent", "children", "clocks")

    def __init__(self, text: str, parent: _Node | None) -> None:
        self.text = text
        self.parent = parent
        self.children: dict[str, _Node] = {}
        self.clocks: dict[str, int] = {}  # tenant -> logical time of its last insert through here


class ApproximatePrefixTree:
    """Prefixes sent to each tenant (worker URL), at most `max_chars_per_tenant` characters each."""

    def __init__(self, max_chars_per_tenant: int) -> None:
        if max_chars_per_tenant < 1:
            raise ValueError("max_chars_per_tenant must be at least 1")
        self.max_chars_per_tenant = max_chars_per_tenant
        self._root = _Node("", None)
        self._clock = 0
        self._sizes: defaultdict[str, int] = defaultdict(int)

    def size(self, tenant: str) -> int:
        """Characters of the tree the tenant holds."""
        return self._sizes.get(tenant, 0)

    def tenants(self) -> set[str]:
        return {tenant for tenant, size in self._sizes.items() if size}

    def insert(self, text: str, tenant: str) -> None:
        """Record that `text` was sent to `tenant` now."""
        self._clock += 1
        node, pos = self._root, 0
        while pos < len(text):
            child = node.children.get(text[pos])
            if child is None:
                child = _Node(text[pos:], node)
                node.children[text[pos]] = child
            else:
                common = common_prefix_length(child.text, text[pos : pos + len(child.text)])
                if common < len(child.text):
                    child = self._split(child, common)
            if tenant not in child.clocks:
                self._sizes[tenant] += len(child.text)
            child.clocks[tenant] = self._clock
            node, pos = child, pos + len(child.text)
        if self._sizes[tenant] > self.max_chars_per_tenant:
            self.evict(tenant, int(self.max_chars_per_tenant * EVICT_TO))

    def match(self, text: str) -> dict[str, int]:
        """For each tenant, the length of the longest prefix of `text` it was sent."""
        matched: dict[str, int] = {}
        node, pos = self._root, 0
        while pos < len(text):
            child = node.children.get(text[pos])
            if child is None:
                break
            common = common_prefix_length(child.text, text[pos : pos + len(child.text)])
            for tenant in child.clocks:
                matched[tenant] = pos + common
            if common < len(child.text):
                break
            node, pos = child, pos + common
        return matched

    def evict(self, tenant: str, target_chars: int) -> None:
        """Drop the tenant's least recently used leaves until it holds at most `target_chars`."""
        heap = [(node.clocks[tenant], id(node), node) for node in self._leaves_of(tenant)]
        heapq.heapify(heap)
        while self._sizes[tenant] > target_chars and heap:
            _, _, node = heapq.heappop(heap)
            self._drop(node, tenant)
            parent = node.parent
            if parent is not self._root and parent is not None and self._is_leaf_of(parent, tenant):
                heapq.heappush(heap, (parent.clocks[tenant], id(parent), parent))

    def remove_tenant(self, tenant: str) -> None:
        """Forget everything sent to `tenant` (a worker that left the pool)."""
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            if tenant in node.clocks:
                stack.extend(node.children.values())
                self._drop(node, tenant)
        self._sizes.pop(tenant, None)

    def clear(self) -> None:
        self._root = _Node("", None)
        self._sizes.clear()

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut `node`'s edge after `at` characters; returns the new upper node."""
        parent = node.parent
        assert parent is not None
        upper = _Node(node.text[:at], parent)
        upper.clocks = dict(node.clocks)
        parent.children[upper.text[0]] = upper
        node.text = node.text[at:]
        node.parent = upper
        upper.children[node.text[0]] = node
        return upper

    def _drop(self, node: _Node, tenant: str) -> None:
        del node.clocks[tenant]
        self._sizes[tenant] -= len(node.text)
        if not node.clocks and node.parent is not None:
            # No tenant here means none below either: the whole subtree goes.
            del node.parent.children[node.text[0]]

    def _is_leaf_of(self, node: _Node, tenant: str) -> bool:
        return tenant in node.clocks and not any(
            tenant in child.clocks for child in node.children.values()
        )

    def _leaves_of(self, tenant: str) -> list[_Node]:
        leaves, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            if tenant not in node.clocks:
                continue
            below = [child for child in node.children.values() if tenant in child.clocks]
            if below:
                stack.extend(below)
            else:
                leaves.append(node)
        return leaves
