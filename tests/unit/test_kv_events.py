"""KV events as a vLLM subscriber sees them: the radix cache with a `KVEventPublisher` as its
sink, the stream decoded with vLLM's own struct definitions (copied below as the reference),
the hash chain recomputed independently, replay of a missed sequence number, a full queue that
drops instead of blocking, and a property test of the block bookkeeping under random inserts
and evictions."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import zmq
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from tests.unit.vllm_kv_events import (
    DECODER,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    reference_hashes,
)

from radixserve.kv_event_format import block_hashes
from radixserve.mem_cache.allocator import TokenSlotAllocator
from radixserve.mem_cache.kv_events import KVEventPublisher, block_event
from radixserve.mem_cache.memory_pool import ReqToTokenPool
from radixserve.mem_cache.radix_cache import RadixCache

BS = 4  # block size: small, so short keys span several blocks


# --- a publisher, a subscriber and a cache ------------------------------------------------


class Subscriber:
    """A vLLM-style consumer: SUB for the stream, DEALER for replay requests."""

    def __init__(self, ctx: zmq.Context, endpoint: str, replay: str | None) -> None:
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.replay = None
        if replay:
            self.replay = ctx.socket(zmq.DEALER)
            self.replay.connect(replay)

    def next(self, timeout_ms: int = 5000) -> tuple[int, KVEventBatch]:
        assert self.sub.poll(timeout_ms), "no event batch arrived"
        topic, seq, payload = self.sub.recv_multipart()
        assert topic == b""
        return int.from_bytes(seq, "big"), DECODER.decode(payload)

    def events(self, count: int = 1) -> list[Any]:
        """At least `count` events, from however many batches they came in."""
        got: list[Any] = []
        while len(got) < count:
            got += self.next()[1].events
        return got

    def ask_replay(self, start: int) -> list[tuple[int, KVEventBatch]]:
        assert self.replay is not None
        self.replay.send_multipart((b"", start.to_bytes(8, "big")))
        got = []
        while True:
            assert self.replay.poll(5000), "no replay answer"
            _, seq, payload = self.replay.recv_multipart()
            if int.from_bytes(seq, "big", signed=True) == -1:
                assert payload == b""
                return got
            got.append((int.from_bytes(seq, "big"), DECODER.decode(payload)))


def wait_until_joined(publisher: KVEventPublisher, sub: Subscriber) -> None:
    """PUB drops what it sends before a SUB has joined: probe until one gets through, then
    drain the probes."""
    for _ in range(100):
        publisher.cleared()
        if sub.sub.poll(50):
            break
    while sub.sub.poll(300):
        sub.sub.recv_multipart()


@pytest.fixture
def stream(tmp_path):  # type: ignore[no-untyped-def]
    endpoint, replay = f"ipc://{tmp_path}/events", f"ipc://{tmp_path}/replay"
    publisher = KVEventPublisher(endpoint, replay, block_size=BS)
    ctx = zmq.Context()
    subscriber = Subscriber(ctx, endpoint, replay)
    cache = RadixCache(
        ReqToTokenPool(size=4, max_context_len=64, device="cpu"),
        TokenSlotAllocator(256),
        event_sink=publisher,
    )
    # PUB drops what it sends before the SUB has joined: wait until a probe gets through
    deadline = time.monotonic() + 5
    while True:
        publisher.cleared()
        if subscriber.sub.poll(100):
            break
        assert time.monotonic() < deadline, "the subscriber never joined"
    while subscriber.sub.poll(300):  # the probes
        subscriber.sub.recv_multipart()
    yield publisher, subscriber, cache
    publisher.close()
    for sock in (subscriber.sub, subscriber.replay):
        sock.close(linger=0)
    ctx.term()


def insert(cache: RadixCache, key: list[int]) -> None:
    value = cache.token_to_kv_pool_allocator.alloc(len(key))
    assert value is not None
    cache.token_to_kv_pool_allocator.free(value[: cache.insert(key, value)])


# --- the stream -----------------------------------------------------------------------------


def test_a_prefill_stores_its_full_blocks_chained_parent_to_child(stream) -> None:  # type: ignore[no-untyped-def]
    publisher, sub, cache = stream
    prompt = list(range(100, 110))  # 2 full blocks and a partial one
    insert(cache, prompt)
    (event,) = sub.events()
    assert isinstance(event, BlockStored)
    assert event.block_hashes == reference_hashes(prompt, BS)
    assert event.parent_block_hash is None
    assert event.token_ids == prompt[:8]
    assert (event.block_size, event.medium, event.lora_id, event.lora_name) == (
        BS,
        "GPU",
        None,
        None,
    )

    # the partial third block is published once a longer prompt completes it
    longer = prompt + [7, 7, 7, 7, 7]
    insert(cache, longer)
    (event,) = sub.events()
    assert isinstance(event, BlockStored)
    assert event.parent_block_hash == reference_hashes(prompt, BS)[1]
    assert event.block_hashes == reference_hashes(longer, BS)[2:]
    assert event.token_ids == longer[8:12]


def test_eviction_removes_every_block_the_node_overlapped(stream) -> None:  # type: ignore[no-untyped-def]
    publisher, sub, cache = stream
    shared, a, b = [1, 2, 3, 4, 5, 6], [10, 11, 12, 13], [20, 21, 22, 23]
    insert(cache, shared + a)
    insert(cache, shared + b)
    stored = sub.events(2)
    assert [len(e.block_hashes) for e in stored] == [2, 1]  # the branch re-stores block 1 only
    cache.match_prefix(shared + b)  # a is now the least recently used leaf
    cache.evict(1)
    (removed,) = sub.events()
    assert isinstance(removed, BlockRemoved) and removed.medium == "GPU"
    # a's node held tokens 6..9: block 1 (tokens 4..7) overlapped it, block 2 ended in it
    assert removed.block_hashes == reference_hashes(shared + a, BS)[1:]
    cache.evict(100)
    events = sub.events(2)
    removed_all = {h for e in events for h in e.block_hashes}
    assert removed_all == set(reference_hashes(shared + b, BS))


def test_a_flush_clears_everything(stream) -> None:  # type: ignore[no-untyped-def]
    publisher, sub, cache = stream
    insert(cache, list(range(8)))
    sub.events()
    cache.reset()
    assert isinstance(sub.events()[0], AllBlocksCleared)


def test_a_missed_sequence_number_is_replayed(stream) -> None:  # type: ignore[no-untyped-def]
    publisher, sub, cache = stream
    insert(cache, list(range(0, 8)))
    first_seq, first = sub.next()
    insert(cache, list(range(50, 58)))
    # this subscriber "loses" the next batch: it reads past it and sees the gap
    sub.next()
    insert(cache, list(range(90, 98)))
    last_seq, last = sub.next()
    assert last_seq == first_seq + 2
    replayed = sub.ask_replay(first_seq + 1)
    assert [seq for seq, _ in replayed] == [first_seq + 1, last_seq]
    lost = replayed[0][1].events[0]
    assert lost.token_ids == list(range(50, 58))
    assert replayed[1][1] == last


def test_medium_moves_between_tiers_through_the_sink(stream) -> None:  # type: ignore[no-untyped-def]
    """What the host and disk tiers report: GPU pages written back to the host, then dropped
    from the GPU; a consumer sees the same hashes change medium."""
    publisher, sub, cache = stream
    path = list(range(30, 38))
    hashes = reference_hashes(path, BS)
    publisher.stored(path, 0, "GPU")
    publisher.stored(path, 0, "CPU")
    publisher.removed(path, 0, "GPU")
    publisher.stored(path, 0, "DISK")
    seen = sub.events(4)
    assert [(type(e).__name__, e.medium) for e in seen] == [
        ("BlockStored", "GPU"),
        ("BlockStored", "CPU"),
        ("BlockRemoved", "GPU"),
        ("BlockStored", "DISK"),
    ]
    assert all(e.block_hashes == hashes for e in seen)


def test_a_full_queue_drops_and_counts_instead_of_blocking(tmp_path) -> None:
    publisher = KVEventPublisher(f"ipc://{tmp_path}/full", block_size=BS, queue_size=4)
    try:
        path = list(range(4096))  # hashing 1024 blocks keeps the thread busy
        start = time.perf_counter()
        for _ in range(200):
            publisher.stored(path, 0, "GPU")
        assert time.perf_counter() - start < 0.5
        assert publisher.dropped_updates > 0
        deadline = time.monotonic() + 20
        while publisher.published_events + publisher.dropped_updates < 200:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        published, dropped = publisher.pop_counts()
        assert (published + dropped, dropped) == (200, publisher.dropped_updates)
        assert publisher.pop_counts() == (0, 0)
    finally:
        publisher.close()


# --- the block bookkeeping, by property --------------------------------------------------------


class BlockLedger:
    """A sink that applies each update's event at once, as a consumer's index would."""

    def __init__(self) -> None:
        self.blocks: set[int] = set()

    def stored(self, token_ids, start, medium) -> None:  # type: ignore[no-untyped-def]
        event = block_event("stored", tuple(token_ids), start, medium, BS)
        if event is not None:
            assert not self.blocks & set(event.block_hashes), "a block stored twice"
            self.blocks |= set(event.block_hashes)

    def removed(self, token_ids, start, medium) -> None:  # type: ignore[no-untyped-def]
        event = block_event("removed", tuple(token_ids), start, medium, BS)
        if event is not None:
            assert set(event.block_hashes) <= self.blocks, "a block removed that was not stored"
            self.blocks -= set(event.block_hashes)

    def cleared(self) -> None:
        self.blocks.clear()


class CacheEventsMachine(RuleBasedStateMachine):
    """Random inserts, matches (splits) and evictions: the blocks the events describe are
    always exactly the full blocks of the prefixes the tree holds."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = BlockLedger()
        self.cache = RadixCache(
            ReqToTokenPool(size=2, max_context_len=32, device="cpu"),
            TokenSlotAllocator(4096),
            event_sink=self.ledger,
        )

    @rule(key=st.lists(st.integers(0, 2), min_size=1, max_size=14))
    def insert(self, key: list[int]) -> None:
        insert(self.cache, key)

    @rule(key=st.lists(st.integers(0, 2), min_size=1, max_size=14))
    def match(self, key: list[int]) -> None:
        self.cache.match_prefix(key)

    @rule(n=st.integers(1, 12))
    def evict(self, n: int) -> None:
        self.cache.evict(n)

    @rule()
    def flush(self) -> None:
        self.cache.reset()

    @invariant()
    def blocks_match_the_tree(self) -> None:
        expected: set[int] = set()
        stack = list(self.cache.root_node.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            expected |= set(block_hashes(self.cache.token_path(node), BS))
        assert self.ledger.blocks == expected


TestCacheEvents = CacheEventsMachine.TestCase
TestCacheEvents.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_block_hashes_match_the_reference() -> None:
    tokens = torch.randint(0, 50000, (70,)).tolist()
    assert block_hashes(tokens, 16) == reference_hashes(tokens, 16)


def test_a_consumers_endpoint_is_dialled_with_the_topic_it_filters_on(tmp_path) -> None:
    """llm-d's EPP binds its SUB and the workers connect, naming themselves in the topic."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    publisher = KVEventPublisher(f"tcp://127.0.0.1:{port}", block_size=BS, topic="kv@10.0.0.7@m")
    try:
        for _ in range(100):
            publisher.stored(list(range(8)), 0, "GPU")
            if sub.poll(50):
                break
        topic, _, payload = sub.recv_multipart()
        assert topic == b"kv@10.0.0.7@m"
        assert isinstance(DECODER.decode(payload).events[0], BlockStored)
    finally:
        publisher.close()
        sub.close(linger=0)
        ctx.term()


def test_medium_follows_pages_between_the_gpu_and_the_host_tier(tmp_path) -> None:
    """The tiered cache (--kv-host-memory) through the same publisher: a prompt stored on the
    GPU, written back to the host when the GPU evicts it (stored CPU, removed GPU), copied back
    on a hit (stored GPU again), the hashes unchanged throughout."""
    from radixserve.mem_cache.host_pool import HostKVPool
    from radixserve.mem_cache.memory_pool import TokenToKVPool
    from radixserve.mem_cache.tiered_cache import TieredRadixCache

    endpoint = f"ipc://{tmp_path}/tiers"
    publisher = KVEventPublisher(endpoint, block_size=BS)
    ctx = zmq.Context()
    sub = Subscriber(ctx, endpoint, None)
    kv_pool = TokenToKVPool(32, 1, 1, 2, torch.float32, "cpu")
    cache = TieredRadixCache(
        ReqToTokenPool(2, 32, "cpu"),
        TokenSlotAllocator(32),
        HostKVPool(kv_pool, 64),
        "write_back",
        event_sink=publisher,
    )
    try:
        wait_until_joined(publisher, sub)
        prompt = list(range(40, 52))  # 3 blocks
        hashes = reference_hashes(prompt, BS)
        insert(cache, prompt)
        assert cache.evict(len(prompt)) == len(prompt)  # written back to the host first
        cache.restore(prompt)
        seen = [e for e in sub.events(4) if not isinstance(e, AllBlocksCleared)]
        moves = [(type(e).__name__, e.medium) for e in seen]
        assert moves == [
            ("BlockStored", "GPU"),
            ("BlockStored", "CPU"),
            ("BlockRemoved", "GPU"),
            ("BlockStored", "GPU"),
        ]
        assert all(e.block_hashes == hashes for e in seen)
    finally:
        publisher.close()
        sub.sub.close(linger=0)
        ctx.term()


def test_medium_follows_pages_through_gpu_cpu_and_disk(tmp_path) -> None:
    """All three tiers (--kv-host-memory, --kv-disk-path) through the publisher, as a vLLM
    subscriber decodes them, the hashes the same on every medium: a finished prompt stored on
    the GPU and, once the writer thread has landed its files, on DISK; evicted to the host
    (stored CPU, removed GPU) and from there (removed CPU); a disk hit read back (stored CPU,
    stored GPU); its files pushed out by newer blocks past the size limit (removed DISK)."""
    from tests.unit.test_radix_cache import FakeReq

    from radixserve.mem_cache.disk_store import DiskKVStore, fingerprint_of
    from radixserve.mem_cache.host_pool import HostKVPool
    from radixserve.mem_cache.memory_pool import TokenToKVPool
    from radixserve.mem_cache.tiered_cache import TieredRadixCache

    endpoint = f"ipc://{tmp_path}/tiers"
    publisher = KVEventPublisher(endpoint, block_size=BS)
    ctx = zmq.Context()
    sub = Subscriber(ctx, endpoint, None)
    kv_pool = TokenToKVPool(32, 1, 1, 2, torch.float32, "cpu")
    req_pool = ReqToTokenPool(2, 32, "cpu")
    allocator = TokenSlotAllocator(32)
    disk = DiskKVStore(tmp_path / "disk", 1 << 20, fingerprint_of(model="t"), block_tokens=BS)
    cache = TieredRadixCache(req_pool, allocator, HostKVPool(kv_pool, 64), "write_back", disk)

    def finish(prompt: list[int]) -> None:
        row = req_pool.alloc(1)[0]
        req_pool.write(row, 0, allocator.alloc(len(prompt)))
        cache.cache_finished_req(FakeReq(row, prompt, kv_len=len(prompt)))
        disk.flush()  # the writer thread's events before the next step's

    try:
        wait_until_joined(publisher, sub)
        cache.event_sink = publisher  # as the scheduler attaches it (the disk is empty)
        prompt = list(range(40, 52))  # 3 blocks, each its own disk file
        hashes = reference_hashes(prompt, BS)
        finish(prompt)
        disk.max_bytes = disk.used_bytes()  # room for these three files only
        assert cache.evict(len(prompt)) == len(prompt)  # written back to the host first
        cache._evict_host(len(prompt))  # and out of the host
        assert cache.match_prefix(prompt).restorable == len(prompt)  # the disk has it all
        assert cache.restore(prompt) == {"host": 0, "disk": len(prompt)}
        finish(list(range(60, 72)))  # three new files push the old ones out
        events = sub.events()
        while sub.sub.poll(500):  # every batch there is
            events += sub.next()[1].events
        seen = [
            e
            for e in events
            if not isinstance(e, AllBlocksCleared) and set(e.block_hashes) <= set(hashes)
        ]
        moves = [(type(e).__name__, e.medium, e.block_hashes) for e in seen]
        assert moves == [
            ("BlockStored", "GPU", hashes),
            ("BlockStored", "DISK", hashes),  # the three files, as one range
            ("BlockStored", "CPU", hashes),
            ("BlockRemoved", "GPU", hashes),
            ("BlockRemoved", "CPU", hashes),
            ("BlockStored", "CPU", hashes),  # read from disk into the host tier
            ("BlockStored", "GPU", hashes),  # and copied to the device
            *[("BlockRemoved", "DISK", [h]) for h in hashes],
        ]
        disk_stored = [e for e in seen if isinstance(e, BlockStored) and e.medium == "DISK"]
        assert disk_stored[0].parent_block_hash is None and disk_stored[0].token_ids == prompt
    finally:
        disk.close()
        publisher.close()
        sub.sub.close(linger=0)
        ctx.term()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"kv_events_endpoint": "5557"}, "--kv-events-endpoint must be a ZMQ endpoint"),
        ({"kv_events_replay_endpoint": "tcp://*:5558"}, "needs --kv-events-endpoint"),
        ({"kv_events_endpoint": "tcp://*:5557", "disable_radix_cache": True}, "radix cache"),
        ({"kv_events_block_size": 0}, "--kv-events-block-size must be positive"),
    ],
)
def test_kv_event_flags_are_checked(flags, message) -> None:  # type: ignore[no-untyped-def]
    from radixserve.server_args import ServerArgs

    with pytest.raises(ValueError, match=message):
        ServerArgs(**flags)
    assert ServerArgs(kv_events_endpoint="tcp://*:5557").kv_events_block_size == 16
