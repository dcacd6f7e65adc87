"""The router's approximate prefix tree against a brute-force model of what was inserted."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.router.prefix_tree import ApproximatePrefixTree, common_prefix_length

TENANTS = ("http://a:1", "http://b:1", "http://c:1")


def held_chars(tree: ApproximatePrefixTree) -> dict[str, int]:
    """Characters per tenant, recounted from the nodes; checks the tree's invariants on the way."""
    counts: dict[str, int] = {}
    stack = [(child, tree._root) for child in tree._root.children.values()]
    while stack:
        node, parent = stack.pop()
        assert node.parent is parent and node.text and node.clocks
        assert parent.children[node.text[0]] is node
        if parent is not tree._root:
            assert node.clocks.keys() <= parent.clocks.keys()
            assert all(node.clocks[t] <= parent.clocks[t] for t in node.clocks)
        for tenant in node.clocks:
            counts[tenant] = counts.get(tenant, 0) + len(node.text)
        stack.extend((child, node) for child in node.children.values())
    return counts


def distinct_prefix_chars(strings: list[str]) -> int:
    """Size of the trie of `strings`: the number of distinct non-empty prefixes."""
    return len({s[:i] for s in strings for i in range(1, len(s) + 1)})


@given(st.text(alphabet="ab", max_size=12), st.text(alphabet="ab", max_size=12))
def test_common_prefix_length_is_the_naive_one(a: str, b: str) -> None:
    naive = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    assert common_prefix_length(a, b) == naive


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(TENANTS), st.text(alphabet="abc", min_size=1, max_size=10)),
        max_size=25,
    ),
    st.text(alphabet="abc", max_size=12),
)
def test_match_and_sizes_equal_brute_force_without_eviction(inserts, query) -> None:
    tree = ApproximatePrefixTree(max_chars_per_tenant=10_000)
    sent: dict[str, list[str]] = {}
    for tenant, text in inserts:
        tree.insert(text, tenant)
        sent.setdefault(tenant, []).append(text)
    expected = {
        tenant: max(common_prefix_length(query, text) for text in texts)
        for tenant, texts in sent.items()
    }
    assert tree.match(query) == {t: n for t, n in expected.items() if n > 0}
    assert held_chars(tree) == {t: distinct_prefix_chars(texts) for t, texts in sent.items()}
    assert {t: tree.size(t) for t in sent} == held_chars(tree)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(TENANTS), st.text(alphabet="abcd", min_size=1, max_size=12)),
        max_size=40,
    )
)
def test_eviction_keeps_every_tenant_under_its_bound_and_the_tree_consistent(inserts) -> None:
    tree = ApproximatePrefixTree(max_chars_per_tenant=16)
    for tenant, text in inserts:
        tree.insert(text, tenant)
        assert tree.size(tenant) <= 16
        counts = held_chars(tree)
        assert {t: tree.size(t) for t in counts} == counts


def test_a_split_edge_keeps_both_prompts_and_their_tenants() -> None:
    tree = ApproximatePrefixTree(1000)
    tree.insert("hello world", "A")
    tree.insert("hello there", "B")
    assert tree.match("hello world, again") == {"A": 11, "B": 6}
    assert tree.match("hello there") == {"A": 6, "B": 11}
    assert tree.match("help") == {"A": 3, "B": 3}
    assert tree.match("goodbye") == {}
    assert (tree.size("A"), tree.size("B")) == (11, 11)


def test_eviction_drops_the_least_recently_sent_prompt_first() -> None:
    tree = ApproximatePrefixTree(max_chars_per_tenant=30)
    tree.insert("system-one:" + "x" * 9, "A")  # 20 chars, oldest
    tree.insert("system-two:" + "y" * 9, "A")  # 20 more: over 30, evict to 27
    assert tree.match("system-one:" + "x" * 9).get("A", 0) < 20
    assert tree.match("system-two:" + "y" * 9)["A"] == 20
    assert tree.size("A") <= 27


def test_a_recent_insert_protects_a_prompt_from_eviction() -> None:
    # "p" is shared; each prompt adds 14 characters below it.
    tree = ApproximatePrefixTree(max_chars_per_tenant=50)
    tree.insert("p1:" + "a" * 12, "A")
    tree.insert("p2:" + "b" * 12, "A")
    tree.insert("p1:" + "a" * 12, "A")  # p1 used again: p2 is now the oldest
    tree.insert("p3:" + "c" * 12, "A")  # 43 characters
    tree.insert("p4:" + "d" * 12, "A")  # 57: over 50, evict down to 45: p2 alone goes
    assert tree.match("p2:" + "b" * 12).get("A", 0) < 15
    assert tree.match("p1:" + "a" * 12)["A"] == 15
    assert tree.match("p4:" + "d" * 12)["A"] == 15


def test_evicting_one_tenant_leaves_the_others_alone() -> None:
    tree = ApproximatePrefixTree(max_chars_per_tenant=20)
    tree.insert("shared-prefix", "B")
    tree.insert("shared-prefix", "A")
    tree.insert("another-prompt", "A")  # A holds 27: over its bound; B is not
    assert tree.match("shared-prefix") == {"B": 13}  # the node stays for B
    assert tree.match("another-prompt") == {"A": 14}
    assert (tree.size("A"), tree.size("B")) == (14, 13)


def test_remove_tenant_forgets_it_and_prunes_empty_nodes() -> None:
    tree = ApproximatePrefixTree(1000)
    tree.insert("abcdef", "A")
    tree.insert("abcxyz", "B")
    tree.remove_tenant("A")
    assert tree.match("abcdef") == {"B": 3}
    assert tree.size("A") == 0 and tree.tenants() == {"B"}
    assert held_chars(tree) == {"B": 6}
