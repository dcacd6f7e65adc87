"""KV events of LoRA adapters' paths, as a vLLM subscriber sees them: the cache keys an adapter's
tokens by its uid (`adapter_key`), the events carry the raw token ids, the adapter's name and
uid, and vLLM's extra keys `(name,)` for every block, in the hashes (checked against vLLM's rule
written out independently) and in `extra_keys`; an eviction withdraws the same hashes; an
unloaded or reloaded adapter's blocks are withdrawn at once and its uid publishes nothing more;
the LoRA manager tells the publisher each uid's name, in order with loads and unloads."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import zmq
from tests.unit.test_kv_events import Subscriber, insert
from tests.unit.vllm_kv_events import BlockRemoved, BlockStored, reference_hashes

from radixserve.kv_event_format import block_hashes
from radixserve.lora.manager import LoRAManager
from radixserve.mem_cache.allocator import TokenSlotAllocator
from radixserve.mem_cache.base_prefix_cache import adapter_key, split_adapter_key
from radixserve.mem_cache.kv_events import KVEventPublisher
from radixserve.mem_cache.memory_pool import ReqToTokenPool
from radixserve.mem_cache.radix_cache import RadixCache

BS = 4
PROMPT = list(range(100, 110))  # 2 full blocks and a partial one


@pytest.fixture
def stream(tmp_path):  # type: ignore[no-untyped-def]
    endpoint = f"ipc://{tmp_path}/events"
    publisher = KVEventPublisher(endpoint, block_size=BS)
    ctx = zmq.Context()
    subscriber = Subscriber(ctx, endpoint, None)
    cache = RadixCache(
        ReqToTokenPool(size=4, max_context_len=64, device="cpu"),
        TokenSlotAllocator(256),
        event_sink=publisher,
    )
    deadline = time.monotonic() + 5  # PUB drops what it sends before the SUB has joined
    while True:
        publisher.cleared()
        if subscriber.sub.poll(100):
            break
        assert time.monotonic() < deadline, "the subscriber never joined"
    while subscriber.sub.poll(300):
        subscriber.sub.recv_multipart()
    yield publisher, subscriber, cache
    publisher.close()
    subscriber.sub.close(linger=0)
    ctx.term()


def test_split_adapter_key_undoes_adapter_key() -> None:
    assert split_adapter_key(adapter_key(PROMPT, 7)) == (7, tuple(PROMPT))
    assert split_adapter_key(PROMPT) == (0, PROMPT)
    assert split_adapter_key([]) == (0, [])


def test_the_router_side_hash_is_vllms_rule_for_a_lora_request() -> None:
    tokens = torch.randint(0, 50000, (70,)).tolist()
    assert block_hashes(tokens, 16, lora_name="sql") == reference_hashes(tokens, 16, ["sql"])
    assert block_hashes(tokens, 16, lora_name="sql") != block_hashes(tokens, 16)


def test_an_adapter_path_publishes_raw_tokens_its_name_uid_and_extra_keys(stream) -> None:  # type: ignore[no-untyped-def]
    publisher, sub, cache = stream
    publisher.adapter_registered(3, "sql")
    insert(cache, adapter_key(PROMPT, 3))
    insert(cache, PROMPT)  # the base model's, beside it
    adapter, base = sub.events(2)
    assert isinstance(adapter, BlockStored) and isinstance(base, BlockStored)
    hashes = reference_hashes(PROMPT, BS, ["sql"])
    assert adapter.block_hashes == hashes and adapter.parent_block_hash is None
    assert adapter.token_ids == PROMPT[:8]
    assert (adapter.lora_id, adapter.lora_name, adapter.medium) == (3, "sql", "GPU")
    assert adapter.extra_keys == [("sql",), ("sql",)]
    # the base path's event is as it always was
    assert base.block_hashes == reference_hashes(PROMPT, BS)
    assert (base.lora_id, base.lora_name, base.extra_keys) == (None, None, None)
    assert not set(hashes) & set(base.block_hashes)

    # a longer prompt completes the third block: its parent is the adapter's second block
    longer = PROMPT + [7, 7]
    insert(cache, adapter_key(longer, 3))
    (more,) = sub.events()
    assert more.parent_block_hash == hashes[1] and more.token_ids == longer[8:12]
    assert more.block_hashes == reference_hashes(longer, BS, ["sql"])[2:]
    assert more.extra_keys == [("sql",)]

    cache.match_prefix(PROMPT)  # the adapter's path is now the least recently used
    cache.evict(6)  # the leaf [7, 7], then its parent
    removed = sub.events(2)
    assert all(isinstance(e, BlockRemoved) and e.medium == "GPU" for e in removed)
    withdrawn = {h for e in removed for h in e.block_hashes}
    assert withdrawn == set(reference_hashes(longer, BS, ["sql"]))


def test_a_retired_adapters_blocks_are_withdrawn_and_it_publishes_no_more(stream) -> None:  # type: ignore[no-untyped-def]
    """Unloaded (or replaced by a reload, which registers a new uid under the same name): its
    paths stay in the cache until evicted, but no request can match them."""
    publisher, sub, cache = stream
    publisher.adapter_registered(1, "sql")
    insert(cache, adapter_key(PROMPT, 1))
    (stored,) = sub.events()
    publisher.adapter_retired(1)
    publisher.adapter_registered(2, "sql")  # the reload
    (withdrawn,) = sub.events()
    assert isinstance(withdrawn, BlockRemoved)
    assert sorted(withdrawn.block_hashes) == sorted(stored.block_hashes)
    # the old uid's path: a request that was running finishes into the cache, then is evicted
    insert(cache, adapter_key(PROMPT + [9, 9, 9], 1))
    cache.evict(100)
    # the new uid's blocks hash alike (by name), with the new id
    insert(cache, adapter_key(PROMPT, 2))
    (reloaded,) = sub.events()  # nothing of uid 1 came before it
    assert isinstance(reloaded, BlockStored) and reloaded.lora_id == 2
    assert reloaded.block_hashes == stored.block_hashes


def test_a_flush_forgets_an_adapters_blocks(stream) -> None:  # type: ignore[no-untyped-def]
    publisher, sub, cache = stream
    publisher.adapter_registered(1, "sql")
    insert(cache, adapter_key(PROMPT, 1))
    sub.events()
    cache.reset()
    sub.events()  # AllBlocksCleared
    publisher.adapter_retired(1)  # withdraws nothing: the flush did
    insert(cache, PROMPT)
    (event,) = sub.events()
    assert isinstance(event, BlockStored) and event.lora_name is None


def test_adapter_names_are_never_dropped_with_a_full_queue(tmp_path) -> None:
    publisher = KVEventPublisher(f"ipc://{tmp_path}/full", block_size=BS, queue_size=2)
    try:
        path = list(range(4096))
        for _ in range(50):  # keeps the thread busy and the queue full
            publisher.stored(path, 0, "GPU")
        dropped = publisher.dropped_updates
        assert dropped > 0
        publisher.adapter_registered(5, "poet")
        assert publisher.dropped_updates == dropped
        deadline = time.monotonic() + 20
        while publisher._adapters != {5: "poet"}:  # the thread got to it
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        publisher.close()


class NameLog:
    """An AdapterEventSink that records what it is told."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def adapter_registered(self, lora_uid: int, name: str) -> None:
        self.calls.append(("registered", lora_uid, name))

    def adapter_retired(self, lora_uid: int) -> None:
        self.calls.append(("retired", lora_uid))


def test_the_lora_manager_names_every_uid_and_retires_unloaded_and_replaced_ones() -> None:
    pool = SimpleNamespace(max_rank=8, slots=2, batch=SimpleNamespace(device=torch.device("cpu")))
    manager = LoRAManager(pool, max_cpu_loras=4, num_layers=1, shapes={}, dtype=torch.float32)  # type: ignore[arg-type]
    weights = SimpleNamespace(path="/adapters/sql", digest=b"sql-weights")
    manager.add("sql", weights)  # type: ignore[arg-type]
    log = NameLog()
    manager.publish_names(log)  # adapters loaded before events were on
    manager.add("poet", weights)  # type: ignore[arg-type]
    manager.add("sql", weights)  # type: ignore[arg-type]  # a reload: a new uid
    manager.remove("poet")
    assert log.calls == [
        ("registered", 1, "sql"),
        ("registered", 2, "poet"),
        ("retired", 1),
        ("registered", 3, "sql"),
        ("retired", 2),
    ]
    manager.shutdown()
