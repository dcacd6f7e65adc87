"""The layer-group restore of the host KV tier, on the CPU with stand-in events.

The host pool keeps a slot's bytes per layer group; a round's queued restores are issued at
once, group after group, each followed by an event that a pass waits on before the group's
layers read the pool (`KVRestore`). Here events are objects that note when they are recorded
and waited for, so the order (copies, then the event; one wait per group, in order) is checked
without a GPU; tests/gpu/test_kv_tiers_gpu.py runs the same path with real streams.
"""

from __future__ import annotations

import pytest
import torch

from radixserve.mem_cache import host_pool
from radixserve.mem_cache.host_pool import RESTORE_GROUPS, HostKVPool
from radixserve.mem_cache.kv_restore import KVRestore
from radixserve.mem_cache.memory_pool import TokenToKVPool

LAYERS = 10  # more than RESTORE_GROUPS: groups of one and two layers


class NotedEvent:
    """Records, when recorded, which layers already hold what `expect` says; notes waits."""

    def __init__(self, log: list, snapshot=None) -> None:
        self.log = log
        self.snapshot = snapshot
        self.seen: list[int] | None = None

    def record(self) -> None:
        self.seen = self.snapshot() if self.snapshot else []
        self.log.append(("record", self))

    def wait(self) -> None:
        assert self.seen is not None, "waited for an event never recorded"
        self.log.append(("wait", self))


def filled_pool(slots: int) -> TokenToKVPool:
    pool = TokenToKVPool(slots, LAYERS, 2, 4, torch.bfloat16, "cpu")
    for buffer in (*pool.k_buffers, *pool.v_buffers):
        buffer.normal_()
    return pool


def test_a_restore_waits_for_each_group_once_in_order() -> None:
    log: list = []
    events = [NotedEvent(log) for _ in range(3)]
    for event in events:
        event.record()
    restore = KVRestore(events, [0, 0, 1, 1, 2])
    for layer in (0, 1, 2, 3, 4):
        restore.wait(layer)
    restore.wait_all()
    assert [e for kind, e in log if kind == "wait"] == events
    later = KVRestore(events, [0, 0, 1, 1, 2])
    later.wait(3)  # a later group covers the earlier ones: they are not waited for again
    later.wait(0)
    later.wait_all()
    assert [e for kind, e in log if kind == "wait"][3:] == [events[1], events[2]]


@pytest.mark.parametrize("staging_bytes", [host_pool.STAGING_BYTES, 200])
def test_layers_are_cut_into_groups_and_bytes_round_trip_exactly(
    staging_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also with staging buffers of a few tokens: the copies go in pieces."""
    monkeypatch.setattr(host_pool, "STAGING_BYTES", staging_bytes)
    pool = filled_pool(64)
    host = HostKVPool(pool, 96)
    assert len(set(host.layer_group)) == RESTORE_GROUPS
    assert host.layer_group == sorted(host.layer_group)  # consecutive layers per group
    before = [b.clone() for b in (*pool.k_buffers, *pool.v_buffers)]
    source = torch.randperm(64)[:30] + 1
    taken = host.allocator.alloc(60).view(6, 10)  # six runs of five host slots, with gaps
    host_slots = taken[:, :5].flatten()
    host.backup(source, host_slots)
    raw = host.read(host_slots)  # the disk tier's view: buffers side by side, in order
    assert torch.equal(
        raw, torch.cat([b[source].view(30, -1).view(torch.uint8) for b in before], 1)
    )
    target = torch.randperm(64)[:30] + 1
    host.queue_restore(host_slots[:12], target[:12])
    host.queue_restore(host_slots[12:], target[12:])
    assert host.issue_restores() is None  # the CPU: copied on return, nothing to wait for
    for old, new in zip(before, (*pool.k_buffers, *pool.v_buffers), strict=True):
        assert torch.equal(new[target], old[source])
    assert len(host.pop_restore_seconds()) == 1  # one restore per issued round


def test_each_group_event_is_recorded_after_its_layers_and_before_the_next() -> None:
    pool = filled_pool(64)
    before = [b.clone() for b in (*pool.k_buffers, *pool.v_buffers)]
    source = torch.arange(1, 21)
    target = torch.arange(31, 51)

    def restored_layers() -> list[int]:
        return [
            layer
            for layer in range(LAYERS)
            if torch.equal(pool.k_buffers[layer][target], before[layer][source])
            and torch.equal(pool.v_buffers[layer][target], before[LAYERS + layer][source])
        ]

    log: list = []
    host = HostKVPool(pool, 32, new_event=lambda: NotedEvent(log, restored_layers))
    host_slots = host.allocator.alloc(20)
    host.backup(source, host_slots)
    host.queue_restore(host_slots, target)
    restore = host.issue_restores()
    assert restore is not None
    recorded = [event for kind, event in log if kind == "record"]
    assert len(recorded) == RESTORE_GROUPS
    for group, event in enumerate(recorded):
        want = [layer for layer in range(LAYERS) if host.layer_group[layer] <= group]
        assert event.seen == want
    for layer in range(LAYERS):
        restore.wait(layer)
    waited = [event for kind, event in log if kind == "wait"]
    assert waited == recorded  # one wait per group, in layer order


def test_a_cancelled_restore_leaves_the_freed_slots_alone() -> None:
    """A node evicted again before its round's copies were issued: its slots may already hold
    another request's new KV, which the copy must not overwrite."""
    pool = filled_pool(32)
    host = HostKVPool(pool, 32)
    host_slots = host.allocator.alloc(8)
    host.backup(torch.arange(1, 9), host_slots)
    target = torch.arange(11, 19)
    host.queue_restore(host_slots, target)
    for buffer in (*pool.k_buffers, *pool.v_buffers):
        buffer[target[4:]] = 7.0  # the slots went to another request, which wrote them
    host.cancel_restores(target[4:])
    host.issue_restores()
    for buffer in (*pool.k_buffers, *pool.v_buffers):
        assert torch.equal(buffer[target[:4]], buffer[torch.arange(1, 5)])
        assert bool((buffer[target[4:]] == 7.0).all())


def test_only_many_short_runs_are_gathered_on_the_host() -> None:
    from radixserve.mem_cache.host_pool import MAX_RUNS, _fragmented

    long_runs = [(i * 100, i * 200, 100) for i in range(MAX_RUNS + 1)]  # a round's nodes
    assert not _fragmented(long_runs, 100 * len(long_runs))
    single = [(i, 2 * i, 1) for i in range(MAX_RUNS + 1)]
    assert _fragmented(single, len(single))
    assert not _fragmented(single[:MAX_RUNS], MAX_RUNS)
