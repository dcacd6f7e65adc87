"""`--prefix-source events`: an exact prefix index per worker, built from its KV events.

Each worker publishes what its cache stores and drops (`--kv-events-endpoint`, vLLM's wire
format: `kv_event_format`). The router subscribes to every worker in its pool (ZMQ SUB) and
keeps, per worker and medium, the set of block hashes it holds. Where to subscribe is resolved
per worker (`Resolver`): the router asks the worker's `/get_server_info` for its
`kv_events_endpoint` and `kv_events_replay_endpoint` (a wildcard host becomes the worker's),
else takes `--kv-events-port` and `--kv-events-replay-port` on the worker's host. A request's prompt, tokenized as the worker tokenizes it (the worker's `POST /tokenize`,
or `/generate`'s own `input_ids`), becomes the same hash chain (under a LoRA adapter, the chain
with the adapter's name as every block's extra key, as the worker hashes that adapter's blocks);
a worker's match is how many of its leading blocks that worker holds on any medium. That replaces the approximate tree's
guess (what the router sent where) by what the workers hold, evictions included.

A gap in a worker's sequence numbers means lost batches: with `--kv-events-replay-port` they
are asked for again (vLLM's replay protocol), else the worker's index is dropped and rebuilt
from what follows (a miss routes by load, never wrongly by prefix for long).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from urllib.parse import urlsplit

import msgspec
import zmq
import zmq.asyncio

from radixserve.kv_event_format import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    block_hashes,
)

logger = logging.getLogger(__name__)

_DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)
REPLAY_TIMEOUT_S = 2.0
WILDCARD_HOSTS = ("*", "0.0.0.0", "::", "[::]", "")

# a worker URL -> its (events endpoint, replay endpoint or None)
Resolver = Callable[[str], Awaitable[tuple[str, str | None]]]


def worker_endpoint(url: str, endpoint: str) -> str:
    """`endpoint` as the worker bound it (tcp://*:5557), with the worker's host for a wildcard."""
    scheme, sep, rest = endpoint.partition("://")
    host, colon, port = rest.rpartition(":")
    if not sep or not colon or host not in WILDCARD_HOSTS:
        return endpoint
    worker_host = urlsplit(url).hostname or "127.0.0.1"
    return (
        f"{scheme}://[{worker_host}]:{port}"
        if ":" in worker_host
        else f"{scheme}://{worker_host}:{port}"
    )


class WorkerBlocks:
    """The blocks one worker holds, per medium."""

    def __init__(self) -> None:
        self.by_medium: dict[str, set[int]] = {}

    def apply(self, events: Iterable[BlockStored | BlockRemoved | AllBlocksCleared]) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                self.by_medium.setdefault(event.medium or "GPU", set()).update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                self.by_medium.get(event.medium or "GPU", set()).difference_update(
                    event.block_hashes
                )
            else:
                self.by_medium.clear()

    def leading(self, hashes: Sequence[int]) -> int:
        """How many of `hashes`, from the first, this worker holds (on any medium)."""
        sets = list(self.by_medium.values())
        n = 0
        for h in hashes:
            if not any(h in s for s in sets):
                break
            n += 1
        return n

    def size(self) -> int:
        return sum(len(s) for s in self.by_medium.values())


class KVEventIndex:
    """Every worker's blocks, fed by one subscription task per worker."""

    def __init__(
        self,
        port: int,
        replay_port: int | None,
        block_size: int,
        resolve: Resolver | None = None,
    ) -> None:
        self.port = port
        self.replay_port = replay_port
        self.block_size = block_size
        self._resolve = resolve or self.by_port
        self._replay_endpoints: dict[str, str | None] = {}
        self.workers: dict[str, WorkerBlocks] = {}
        self.last_seq: dict[str, int] = {}  # per worker, the last batch applied
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping: set[asyncio.Task[None]] = set()  # cancelled, their sockets not closed yet
        self._ctx = zmq.asyncio.Context()
        self.batches = 0
        self.gaps = 0

    # --- what the policy asks ----------------------------------------------------------------

    def match(
        self, token_ids: Sequence[int], urls: Iterable[str], lora_name: str | None = None
    ) -> dict[str, int]:
        """Tokens of the prompt (under the LoRA adapter `lora_name`, None: the base model) each
        worker holds, counted in whole blocks."""
        hashes = block_hashes(token_ids, self.block_size, lora_name=lora_name)
        return {
            url: self.workers[url].leading(hashes) * self.block_size
            for url in urls
            if url in self.workers
        }

    def size(self, url: str) -> int:
        blocks = self.workers.get(url)
        return blocks.size() if blocks is not None else 0

    def describe(self) -> dict[str, object]:
        """For the router's server info: batches applied, gaps seen, blocks held per worker."""
        return {
            "batches": self.batches,
            "gaps": self.gaps,
            "blocks": {url: blocks.size() for url, blocks in self.workers.items()},
        }

    # --- subscriptions ----------------------------------------------------------------------

    def track(self, urls: Iterable[str]) -> None:
        """Subscribe to every worker in `urls` (again, where a subscription ended on an
        error), unsubscribe from the others."""
        wanted = set(urls)
        for url in list(self._tasks):
            if url not in wanted:
                self.forget(url)
        for url in wanted:
            task = self._tasks.get(url)
            if task is not None and not task.done():
                continue
            if task is not None and not task.cancelled() and task.exception() is not None:
                logger.warning("kv events of %s: %r; subscribing again", url, task.exception())
            self.workers[url] = WorkerBlocks()
            self._tasks[url] = asyncio.get_running_loop().create_task(self._follow(url))

    def forget(self, url: str) -> None:
        task = self._tasks.pop(url, None)
        if task is not None:
            task.cancel()
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
        self.workers.pop(url, None)
        self.last_seq.pop(url, None)
        self._replay_endpoints.pop(url, None)

    def reset(self, url: str) -> None:
        """The worker's cache was flushed: forget its blocks (its AllBlocksCleared follows)."""
        if url in self.workers:
            self.workers[url] = WorkerBlocks()

    async def close(self) -> None:
        for url in list(self._tasks):
            self.forget(url)
        for task in list(self._stopping):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._ctx.destroy(linger=0)

    async def by_port(self, url: str) -> tuple[str, str | None]:
        """--kv-events-port (and --kv-events-replay-port) on the worker's host."""
        replay = worker_endpoint(url, f"tcp://*:{self.replay_port}") if self.replay_port else None
        return worker_endpoint(url, f"tcp://*:{self.port}"), replay

    async def _follow(self, url: str) -> None:
        endpoint, self._replay_endpoints[url] = await self._resolve(url)
        logger.info("kv events of %s: subscribing to %s", url, endpoint)
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(endpoint)
        try:
            while True:
                _, seq_bytes, payload = await sub.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big")
                last = self.last_seq.get(url)
                if last is not None and seq > last + 1:
                    self.gaps += 1
                    if not await self._replay(url, last + 1, seq):
                        logger.warning(
                            "kv events from %s: batches %d-%d lost; its index starts over",
                            url,
                            last + 1,
                            seq - 1,
                        )
                        self.workers[url] = WorkerBlocks()
                self.last_seq[url] = seq
                self._apply(url, payload)
        finally:
            sub.close(linger=0)

    def _apply(self, url: str, payload: bytes) -> None:
        try:
            batch = _DECODER.decode(payload)
        except msgspec.DecodeError:
            logger.warning("kv events from %s: a batch that does not decode", url)
            return
        blocks = self.workers.get(url)
        if blocks is not None:
            blocks.apply(batch.events)
            self.batches += 1

    async def _replay(self, url: str, start: int, stop: int) -> bool:
        """Ask the worker's replay socket for batches start..stop-1; True if all came."""
        endpoint = self._replay_endpoints.get(url)
        if endpoint is None:
            return False
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.connect(endpoint)
        got = start
        try:
            await dealer.send_multipart((b"", start.to_bytes(8, "big")))
            while True:
                if not await dealer.poll(REPLAY_TIMEOUT_S * 1000):
                    return False
                _, seq_bytes, payload = await dealer.recv_multipart()
                if seq_bytes == END_SEQ:
                    return got >= stop
                seq = int.from_bytes(seq_bytes, "big")
                if seq == got and seq < stop:
                    self._apply(url, payload)
                    got += 1
        finally:
            dealer.close(linger=0)
