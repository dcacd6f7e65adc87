"""KV events from a real worker process, read as llm-d or Dynamo would: a SUB socket decoding
vLLM's structs (the reference copy in tests/unit/test_kv_events.py). A prompt's prefill stores
its full blocks, chained parent to child; prompts that overflow a small pool evict it, which
removes the same hashes; a flush clears; a batch the subscriber lost comes back through the
replay socket; /metrics counts what was published and shows cache_config_info."""

from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest
import zmq
from tests.unit.vllm_kv_events import DECODER, BlockRemoved, BlockStored, reference_hashes

from radixserve.bench.server_process import ServerProcess, free_port

pytestmark = pytest.mark.slow

BLOCK = 16
POOL = 256  # tokens: four 60-token prompts overflow it


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    pub, replay = free_port(), free_port()
    args = ["--model", "random:tiny-llama", "--max-total-tokens", str(POOL)]
    args += ["--kv-events-endpoint", f"tcp://*:{pub}"]
    args += ["--kv-events-replay-endpoint", f"tcp://127.0.0.1:{replay}"]
    log = tmp_path_factory.mktemp("kv_events") / "server.log"
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{pub}")  # ZMQ reconnects until the worker binds
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{replay}")
    with ServerProcess(args, log_path=log) as server:
        time.sleep(0.3)  # the SUB's subscription reaches the bound PUB
        yield server, sub, dealer
    sub.close(linger=0)
    dealer.close(linger=0)
    ctx.term()


def generate(server: ServerProcess, input_ids: list[int]) -> dict:
    body = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}
    request = urllib.request.Request(
        server.base_url + "/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


def read_until(sub: zmq.Socket, done, timeout: float = 20.0) -> list[tuple[int, list]]:  # type: ignore[no-untyped-def]
    """(seq, events) batches until `done(all events so far)` holds."""
    batches: list[tuple[int, list]] = []
    deadline = time.monotonic() + timeout
    while not done([e for _, events in batches for e in events]):
        assert time.monotonic() < deadline, f"timed out; got {batches}"
        if sub.poll(200):
            _, seq, payload = sub.recv_multipart()
            batches.append((int.from_bytes(seq, "big"), DECODER.decode(payload).events))
    return batches


def test_prefill_eviction_flush_and_replay(worker) -> None:  # type: ignore[no-untyped-def]
    server, sub, dealer = worker
    prompts = [[(37 * p + i) % 900 + 5 for i in range(60)] for p in range(6)]  # vocab 1024
    first = prompts[0]
    generate(server, first)
    # the prompt and its 2 new tokens are cached (61 tokens with KV): 3 full blocks
    batches = read_until(sub, lambda ev: any(isinstance(e, BlockStored) for e in ev))
    stored = [e for _, events in batches for e in events if isinstance(e, BlockStored)]
    hashes = [h for e in stored for h in e.block_hashes]
    assert hashes == reference_hashes(first, BLOCK)[:3]
    assert stored[0].parent_block_hash is None and stored[0].medium == "GPU"
    assert [t for e in stored for t in e.token_ids] == first[:48]

    for prompt in prompts[1:]:  # 5 x 62 tokens through a 256-token pool: the first goes
        generate(server, prompt)
    batches += read_until(
        sub,
        lambda ev: (
            {h for e in ev if isinstance(e, BlockRemoved) for h in e.block_hashes} >= set(hashes)
        ),
    )
    seqs = [seq for seq, _ in batches]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # no gap on a healthy stream

    # a subscriber that lost every batch after the first asks the replay socket for them
    dealer.send_multipart((b"", (seqs[0] + 1).to_bytes(8, "big")))
    replayed = []
    while True:
        assert dealer.poll(5000)
        _, seq, payload = dealer.recv_multipart()
        if int.from_bytes(seq, "big", signed=True) == -1:
            break
        replayed.append((int.from_bytes(seq, "big"), DECODER.decode(payload).events))
    assert replayed[: len(batches) - 1] == batches[1:]

    status, _ = flush(server)
    assert status == 200
    read_until(sub, lambda ev: any(type(e).__name__ == "AllBlocksCleared" for e in ev))

    text = server.get("/metrics")[1].decode()
    published = re.search(r"radixserve_kv_events_published_total\{[^}]*\} (\S+)", text)
    assert published and float(published.group(1)) >= len(stored) + 1
    assert re.search(
        rf'radixserve_cache_config_info\{{block_size="{BLOCK}",model_name="[^"]+",'
        rf'num_gpu_blocks="{POOL // BLOCK}"\}} 1.0',
        text,
    ), text


def flush(server: ServerProcess) -> tuple[int, bytes]:
    request = urllib.request.Request(server.base_url + "/flush_cache", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=30) as reply:
        return reply.status, reply.read()
