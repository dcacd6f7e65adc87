"""A vLLM-style KV event subscriber for scripts/gpu/kv_events.sh: decodes every batch a worker
publishes with vLLM's structs (tests/unit/vllm_kv_events.py), checks the sequence numbers and
that each stored run chains to a block already stored, and writes a summary on SIGTERM.

Usage: python3 scripts/gpu/kv_events_subscriber.py tcp://127.0.0.1:5557 OUT.json
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.unit.vllm_kv_events import DECODER, AllBlocksCleared, BlockRemoved, BlockStored  # noqa: E402


def main(endpoint: str, out: str) -> None:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    kinds: Counter[str] = Counter()
    held: set[int] = set()
    summary = {"batches": 0, "gaps": 0, "broken_chains": 0, "blocks_held_at_end": 0}
    first_ts = last_ts = None
    last_seq = None
    stop = False

    def finish(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, finish)
    while not stop:
        if not sub.poll(200):
            continue
        _, seq_bytes, payload = sub.recv_multipart()
        seq = int.from_bytes(seq_bytes, "big")
        if last_seq is not None and seq != last_seq + 1:
            summary["gaps"] += 1
        last_seq = seq
        batch = DECODER.decode(payload)
        summary["batches"] += 1
        first_ts = first_ts or batch.ts
        last_ts = batch.ts
        for event in batch.events:
            kinds[type(event).__name__] += 1
            if isinstance(event, BlockStored):
                parent = event.parent_block_hash
                if parent is not None and parent not in held:
                    summary["broken_chains"] += 1
                held.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                held.difference_update(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                held.clear()
    summary.update(kinds)
    summary["blocks_held_at_end"] = len(held)
    summary["span_s"] = (last_ts - first_ts) if first_ts else 0.0
    summary["written_at"] = time.time()
    Path(out).write_text(json.dumps(summary, indent=2) + "\n")
    sub.close(linger=0)
    ctx.term()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
