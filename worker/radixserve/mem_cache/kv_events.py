"""`--kv-events-endpoint`: the prefix cache's stores and drops, published as vLLM's KV events.

`KVEventPublisher` is the radix cache's event sink (`kv_event_sink.KVEventSink`). The cache calls
it on the scheduler's thread (the disk tier also on its writer thread: the queue is thread-safe),
where it only queues the token range (a tuple copy); a thread of
its own turns the ranges into blocks and hashes (`kv_event_format`), batches what has queued
into one `EventBatch`, and sends it on a ZMQ PUB socket as `(topic, sequence number, payload)`.
The queue is bounded: when the thread falls behind, an update is dropped and counted, never
waited for, so the step loop is never held by a slow or absent subscriber (PUB itself never
blocks). The last `REPLAY_BATCHES` payloads are kept for the optional ROUTER replay socket,
which answers a request `(8-byte start sequence number)` with every kept batch from there on,
then `END_SEQ` (vLLM's protocol), so a subscriber that saw a gap can catch up.

Token ranges become blocks so: the blocks a range reports are the full `block_size` blocks of
the path whose last token lies in token_ids[start:]. A node's stored range thus publishes
each block once, when its last token arrives (a trailing partial block waits for the node
that completes it), and a removed leaf withdraws every full block that overlapped it.

LoRA adapters: the cache keys an adapter's path by its registration number (uid) above the
vocabulary (`base_prefix_cache.adapter_key`); its events carry the raw token ids, `lora_name`
the adapter's served name, `lora_id` its uid (radixserve's registration number: vLLM's
`lora_int_id` is as local to one server), and the hashes and `extra_keys` of vLLM's rule
(`(name,)` for every block, `kv_event_format`). The LoRA manager tells the publisher which name a
uid serves (`kv_event_sink.AdapterEventSink`), in order with the cache's updates. The thread
keeps, per served adapter, the blocks it published and has not withdrawn; when an adapter is
unloaded or replaced its uid is retired: those blocks are withdrawn at once (no request can
match them any more, and a reload under the same name hashes alike: the new uid's blocks would
otherwise be withdrawn when the old ones are evicted) and later updates of that uid publish
nothing. So the publisher holds names and blocks only of uids being served, bounded by the
cache. Base paths (uid 0) are published as they always were: no lora fields, no extra keys.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from itertools import count

import msgspec
import zmq

from radixserve.kv_event_format import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    block_hashes,
    lora_extra_keys,
)
from radixserve.mem_cache.base_prefix_cache import split_adapter_key
from radixserve.mem_cache.kv_event_sink import Medium

logger = logging.getLogger(__name__)

# updates queued for the publisher thread before new ones are dropped
QUEUE_SIZE = 100_000
# batches kept for replay (vLLM's buffer_steps default)
REPLAY_BATCHES = 10_000
# the PUB socket's high-water mark in frames: beyond it ZMQ drops for a slow subscriber
SEND_HWM = 100_000
# at most this many updates go into one batch
MAX_UPDATES_PER_BATCH = 1024
# a dropped update is logged once per this many
DROP_LOG_EVERY = 10_000
_POLL_S = 0.02

# (kind, token path, start, medium) of the cache's updates; "cleared" carries no range, and the
# LoRA manager's "registered" and "retired" carry an adapter's (uid, name) in (start, medium)
_Update = tuple[str, tuple[int, ...], int, str]
_Event = BlockStored | BlockRemoved | AllBlocksCleared
# a served adapter as its events name it: (lora_id, lora_name)
Adapter = tuple[int, str]


def binds(endpoint: str) -> bool:
    """vLLM's rule: bind a wildcard address or a local transport, connect to anything else."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def block_event(
    kind: str,
    tokens: Sequence[int],
    start: int,
    medium: str,
    block_size: int,
    adapter: Adapter | None = None,
) -> BlockStored | BlockRemoved | None:
    """The event for one stored or removed range of raw token ids (under `adapter`, None: the
    base model): the full blocks whose last token lies in tokens[start:]; None when there is
    none."""
    first, end = start // block_size, len(tokens) // block_size
    if first >= end:
        return None
    lora_id, lora_name = adapter if adapter is not None else (None, None)
    chain = block_hashes(tokens, block_size, end, lora_name)
    if kind == "removed":
        return BlockRemoved(block_hashes=chain[first:], medium=medium)
    return BlockStored(
        block_hashes=chain[first:],
        parent_block_hash=chain[first - 1] if first else None,
        token_ids=list(tokens[first * block_size : end * block_size]),
        block_size=block_size,
        lora_id=lora_id,
        medium=medium,
        lora_name=lora_name,
        extra_keys=[lora_extra_keys(lora_name)] * (end - first) if adapter else None,
    )


class KVEventPublisher:
    """The radix cache's event sink and its publisher thread; see the module docstring.

    Sockets are bound here, so a port in use fails the start; after that only the thread
    touches them.
    """

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        block_size: int = 16,
        topic: str = "",
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self.block_size = block_size
        self._topic = topic.encode()
        # unbounded: the bound (queue_size) applies to the cache's updates only, so that the
        # LoRA manager's few are never dropped (see _put)
        self._updates: queue.Queue[_Update] = queue.Queue()
        self._queue_size = queue_size
        # the publisher thread's: served adapters' names, and per adapter uid and medium the
        # blocks published and not withdrawn
        self._adapters: dict[int, str] = {}
        self._held: dict[int, dict[str, set[int]]] = {}
        # written by the threads that report (the scheduler's; the disk tier's writer)
        self.dropped_updates = 0
        self._drop_lock = threading.Lock()
        self.published_events = 0  # written by the publisher thread only
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(SEND_HWM)
        if binds(endpoint):
            self._pub.bind(endpoint)
        else:  # a consumer's bound endpoint (llm-d's EPP): the publisher dials it
            self._pub.connect(endpoint)
        self._replay: zmq.Socket | None = None
        if replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.bind(replay_endpoint)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=REPLAY_BATCHES)
        self._seq = count()
        self._reported = (0, 0)  # (published, dropped) at the last pop_counts
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    # --- the sink (scheduler's thread) -----------------------------------------------------

    def stored(self, token_ids: Sequence[int], start: int, medium: Medium) -> None:
        self._put(("stored", tuple(token_ids), start, medium))

    def removed(self, token_ids: Sequence[int], start: int, medium: Medium) -> None:
        self._put(("removed", tuple(token_ids), start, medium))

    def cleared(self) -> None:
        self._put(("cleared", (), 0, ""))

    def adapter_registered(self, lora_uid: int, name: str) -> None:
        self._updates.put(("registered", (), lora_uid, name))

    def adapter_retired(self, lora_uid: int) -> None:
        self._updates.put(("retired", (), lora_uid, ""))

    def _put(self, update: _Update) -> None:
        if self._updates.qsize() < self._queue_size:
            self._updates.put_nowait(update)
        else:
            with self._drop_lock:
                self.dropped_updates += 1
                dropped = self.dropped_updates
            if dropped % DROP_LOG_EVERY == 1:
                logger.warning(
                    "kv events: dropped %d cache updates so far (the publisher's queue is full)",
                    dropped,
                )

    def pop_counts(self) -> tuple[int, int]:
        """Events published and updates dropped since the last call (for the metrics)."""
        now = (self.published_events, self.dropped_updates)
        published, dropped = now[0] - self._reported[0], now[1] - self._reported[1]
        self._reported = now
        return published, dropped

    # --- the publisher thread --------------------------------------------------------------

    def _run(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        while not self._stop.is_set() or not self._updates.empty():
            if self._replay is not None and self._replay.poll(0):
                try:
                    self._serve_replay()
                except zmq.ZMQError:  # a client gone mid-reply: the stream goes on
                    logger.exception("kv events: a replay request failed")
            try:
                updates = [self._updates.get(timeout=_POLL_S)]
            except queue.Empty:
                continue
            while len(updates) < MAX_UPDATES_PER_BATCH:
                try:
                    updates.append(self._updates.get_nowait())
                except queue.Empty:
                    break
            events: list[_Event] = []
            for update in updates:
                events += self._events(update)
            if not events:
                continue
            batch = KVEventBatch(ts=time.time(), events=events, data_parallel_rank=0)
            payload = encoder.encode(batch)
            seq = next(self._seq)
            try:
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            except zmq.ZMQError:
                logger.exception("kv events: sending batch %d failed", seq)
            self._buffer.append((seq, payload))
            self.published_events += len(events)

    def _events(self, update: _Update) -> list[_Event]:
        kind, tokens, start, medium = update
        if kind == "cleared":
            for held in self._held.values():
                held.clear()
            return [AllBlocksCleared()]
        if kind == "registered":
            self._adapters[start], self._held[start] = medium, {}
            return []
        if kind == "retired":
            self._adapters.pop(start, None)
            held = self._held.pop(start, {})
            return [BlockRemoved(block_hashes=sorted(h), medium=m) for m, h in held.items() if h]
        lora_uid, token_ids = split_adapter_key(tokens)
        if not lora_uid:
            event = block_event(kind, tokens, start, medium, self.block_size)
            return [] if event is None else [event]
        name = self._adapters.get(lora_uid)
        if name is None:  # a retired adapter's path: its blocks were withdrawn at retirement
            return []
        event = block_event(kind, token_ids, start, medium, self.block_size, (lora_uid, name))
        if event is None:
            return []
        held = self._held[lora_uid].setdefault(medium, set())
        if isinstance(event, BlockStored):
            held.update(event.block_hashes)
        else:
            held.difference_update(event.block_hashes)
        return [event]

    def _serve_replay(self) -> None:
        """One replay request: [identity, empty, start seq] -> the kept batches from there."""
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            logger.warning("kv events: malformed replay request (%d frames)", len(frames))
            return
        client, _, start_bytes = frames
        start = int.from_bytes(start_bytes, "big")
        for seq, payload in list(self._buffer):
            if seq >= start:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))

    def close(self, timeout: float = 1.0) -> None:
        """Publish what is queued (within `timeout`), then close the sockets."""
        self._stop.set()
        self._thread.join(timeout)
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._ctx.term()
