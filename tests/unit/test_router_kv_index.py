"""The router's exact prefix index (`--prefix-source events`): blocks per worker and medium from
decoded KV events, leading-block matches, the cache-aware policy preferring it to the
approximate tree, a real publisher followed over ZMQ with a lost batch recovered by replay, and
which requests the router can tokenize."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import pytest

from radixserve.bench.server_process import free_port
from radixserve.kv_event_format import AllBlocksCleared, BlockRemoved, BlockStored, block_hashes
from radixserve.router.kv_index import KVEventIndex, WorkerBlocks
from radixserve.router.policies import PolicyConfig, create_policy
from radixserve.router.tokens import tokenize_body

BS = 4
PROMPT = list(range(100, 120))  # 5 blocks
HASHES = block_hashes(PROMPT, BS)


def stored(hashes: list[int], medium: str = "GPU") -> BlockStored:
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=None,
        token_ids=[],
        block_size=BS,
        lora_id=None,
        medium=medium,
        lora_name=None,
    )


def test_a_worker_holds_leading_blocks_on_any_medium() -> None:
    blocks = WorkerBlocks()
    blocks.apply([stored(HASHES[:3]), stored(HASHES[3:4], "CPU")])
    assert blocks.leading(HASHES) == 4
    blocks.apply([BlockRemoved(block_hashes=HASHES[1:2], medium="GPU")])
    assert blocks.leading(HASHES) == 1  # a hole ends the prefix
    blocks.apply([stored(HASHES[1:2], "DISK")])
    assert blocks.leading(HASHES) == 4
    blocks.apply([AllBlocksCleared()])
    assert blocks.leading(HASHES) == 0 and blocks.size() == 0


@dataclass
class Worker:
    url: str
    load: float = 0.0


def test_cache_aware_routes_on_events_not_on_what_it_sent() -> None:
    index = KVEventIndex(port=5557, replay_port=None, block_size=BS)
    index.workers = {"http://a": WorkerBlocks(), "http://b": WorkerBlocks()}
    policy = create_policy("cache_aware", PolicyConfig(), index)
    a, b = Worker("http://a"), Worker("http://b")
    # the tree remembers sending the prompt to a ...
    assert policy.choose("key", [a, b], PROMPT)[0] is a
    # ... but only b's events say it holds the prompt's blocks (a evicted them)
    index.workers["http://b"].apply([stored(HASHES)])
    assert policy.choose("key", [a, b], PROMPT) == (b, "prefix")
    # without token ids the tree decides, as with --prefix-source tree
    assert policy.choose("key", [a, b], None) == (a, "prefix")
    # less than --cache-threshold held: the least loaded worker
    index.workers["http://b"].apply([BlockRemoved(block_hashes=HASHES[2:], medium="GPU")])
    b.load = 1
    assert policy.choose("key", [a, b], PROMPT) == (a, "least_loaded")


def test_an_adapters_request_matches_that_adapters_blocks_only() -> None:
    """A worker's blocks under the adapter "sql" hash with its name (vLLM's extra key): a
    request for "sql" matches them, the same prompt for the base model or "poet" does not."""
    index = KVEventIndex(port=5557, replay_port=None, block_size=BS)
    index.workers = {"http://a": WorkerBlocks(), "http://b": WorkerBlocks()}
    index.workers["http://a"].apply([stored(HASHES)])
    index.workers["http://b"].apply([stored(block_hashes(PROMPT, BS, lora_name="sql"))])
    assert index.match(PROMPT, ["http://a", "http://b"], "sql") == {"http://a": 0, "http://b": 20}
    assert index.match(PROMPT, ["http://a", "http://b"]) == {"http://a": 20, "http://b": 0}
    assert index.match(PROMPT, ["http://a", "http://b"], "poet") == {"http://a": 0, "http://b": 0}
    policy = create_policy("cache_aware", PolicyConfig(), index)
    a, b = Worker("http://a"), Worker("http://b", load=1)
    assert policy.choose("", [a, b], PROMPT, "sql") == (b, "prefix")
    assert policy.choose("", [a, b], PROMPT) == (a, "prefix")


def test_the_index_follows_a_worker_and_replays_what_it_missed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from radixserve.mem_cache.kv_events import KVEventPublisher

    port, replay = free_port(), free_port()
    publisher = KVEventPublisher(f"tcp://*:{port}", f"tcp://127.0.0.1:{replay}", block_size=BS)

    async def scenario() -> None:
        index = KVEventIndex(port, replay, BS)
        url = "http://127.0.0.1:1"
        index.track([url])
        try:
            for _ in range(100):  # until the subscription has joined
                publisher.cleared()
                await asyncio.sleep(0.05)
                if index.batches:
                    break
            publisher.stored(PROMPT, 0, "GPU")
            for _ in range(100):
                await asyncio.sleep(0.02)
                if index.match(PROMPT, [url]).get(url):
                    break
            assert index.match(PROMPT, [url]) == {url: 20}
            # what the router lost (a gap in the sequence numbers) is asked for again
            index.workers[url] = WorkerBlocks()
            assert await index._replay(url, 0, index.last_seq[url] + 1)
            assert index.match(PROMPT, [url]) == {url: 20}
            publisher.removed(PROMPT, 8, "GPU")
            for _ in range(100):
                await asyncio.sleep(0.02)
                if index.match(PROMPT, [url])[url] == 8:
                    break
            assert index.match(PROMPT, [url]) == {url: 8}
            index.track([])
            assert index.match(PROMPT, [url]) == {}
        finally:
            await index.close()

    try:
        asyncio.run(scenario())
    finally:
        publisher.close()


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        ("/generate", {"input_ids": [5, 6, 7]}, ([5, 6, 7], None)),
        ("/generate", {"text": "hi"}, (None, {"prompt": "hi"})),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 3}, (None, {"prompt": "hi"})),
        ("/v1/completions", {"prompt": [1, 2]}, ([1, 2], None)),
        ("/v1/chat/completions", {"messages": []}, (None, {"messages": []})),
        ("/v1/messages", {"messages": []}, (None, None)),
        ("/generate", {"input_ids": [1, True]}, (None, None)),
    ],
)
def test_which_prompts_the_router_can_have_as_tokens(path, body, expected) -> None:  # type: ignore[no-untyped-def]
    assert tokenize_body(path, json.dumps(body).encode()) == expected


def test_a_wildcard_endpoint_takes_the_workers_host() -> None:
    from radixserve.router.kv_index import worker_endpoint

    assert worker_endpoint("http://10.0.0.7:8000", "tcp://*:5557") == "tcp://10.0.0.7:5557"
    assert worker_endpoint("http://w:8000", "tcp://0.0.0.0:5557") == "tcp://w:5557"
    assert worker_endpoint("http://[fd00::1]:8000", "tcp://*:5557") == "tcp://[fd00::1]:5557"
    assert worker_endpoint("http://w:8000", "tcp://10.1.1.1:5557") == "tcp://10.1.1.1:5557"


def test_a_subscription_that_failed_is_made_again() -> None:
    calls = []

    async def resolve(url: str) -> tuple[str, str | None]:
        calls.append(url)
        if len(calls) == 1:
            raise RuntimeError("server info unreachable")
        return "tcp://127.0.0.1:1", None

    async def scenario() -> None:
        index = KVEventIndex(5557, None, BS, resolve)
        index.track(["http://w"])
        await asyncio.sleep(0.05)
        index.track(["http://w"])  # the next round of the router's tracker
        await asyncio.sleep(0.05)
        assert calls == ["http://w", "http://w"]
        assert not index._tasks["http://w"].done()
        await index.close()

    asyncio.run(scenario())
