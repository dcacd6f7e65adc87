"""The KV tiers on a real model (random tiny Llama, float32 on the CPU).

- A multi-turn workload whose prefixes are several times the device pool: the host tier gets
  at least twice the prefix-hit tokens of the same worker without it, and the greedy outputs
  are identical (and transformers' own).
- A restarted worker with the disk tier finds its old prefixes: in process, and as a real
  server whose first repeated prompt reports cached_tokens in its usage.
"""

from __future__ import annotations

import json
import random
import time
import urllib.request

import pytest
import zmq
from engine_harness import greedy, hf_greedy, make_scheduler, run_to_completion
from lora_adapters import TINY_LLAMA_SHAPES, write_random_adapter
from tests.unit.vllm_kv_events import DECODER, BlockStored, reference_hashes

from radixserve.bench.server_process import ServerProcess, free_port
from radixserve.model_loader.loader import build_hf_reference, load_model_source

POOL = 128  # device KV tokens
SESSIONS = 6
TURNS = 4
NEW = 8


@pytest.fixture(scope="module")
def tiny_llama():
    source = load_model_source("random:tiny-llama", device="cpu")
    return source, build_hf_reference(source)


def multi_turn(scheduler, vocab: int, seed: int = 0) -> tuple[list[list[int]], int, list]:
    """Sessions taking turns round-robin: each turn's prompt is the whole conversation so far
    plus 8 new user tokens. Returns every turn's output, the prefix-hit tokens, the contexts."""
    rng = random.Random(seed)
    contexts = [[rng.randrange(vocab) for _ in range(24)] for _ in range(SESSIONS)]
    outputs, hits = [], 0
    for _ in range(TURNS):
        for s in range(SESSIONS):
            contexts[s] = contexts[s] + [rng.randrange(vocab) for _ in range(8)]
            result = run_to_completion(scheduler, [contexts[s]], greedy(NEW))["r0"]
            outputs.append(result["ids"])
            hits += result["cached"]
            contexts[s] = contexts[s] + result["ids"]
    return outputs, hits, contexts


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_host_tier_doubles_prefix_hits_with_identical_outputs(tiny_llama, policy):
    source, hf = tiny_llama
    vocab = source.config.vocab_size
    without = make_scheduler("random:tiny-llama", source, max_total_tokens=POOL)
    base_outputs, base_hits, contexts = multi_turn(without, vocab)
    assert sum(len(c) for c in contexts) >= 3 * POOL  # the prefixes are 3x the pool
    tiered = make_scheduler(
        "random:tiny-llama",
        source,
        max_total_tokens=POOL,
        kv_host_memory=0.01,
        kv_write_policy=policy,
    )
    outputs, hits, _ = multi_turn(tiered, vocab)
    assert outputs == base_outputs
    assert hits >= 2 * base_hits and hits > 0
    by_tier = tiered.get_server_info()["prefix_cache_hit_tokens_by_tier"]
    assert by_tier["host"] > 0
    # the last turn of a session is transformers' own greedy continuation
    last = contexts[0][:-NEW]
    assert outputs[-SESSIONS] == hf_greedy(hf, last, NEW)
    info = tiered.get_server_info()
    assert info["protected_size"] == 0


class LoggedEvent:
    """A stand-in for a CUDA event: notes its record and the waits on it, in order."""

    def __init__(self, log: list) -> None:
        self.log = log
        self.index = sum(1 for kind, _ in log if kind == "made")
        log.append(("made", self.index))

    def record(self) -> None:
        self.log.append(("record", self.index))

    def wait(self) -> None:
        self.log.append(("wait", self.index))


@pytest.mark.parametrize("model", ["random:tiny-llama", "random:tiny-deepseek-v2-lite"])
def test_passes_wait_for_restored_layers_group_by_group(model):
    """The layer-wise restore on the CPU: the host pool records stand-in events after each
    layer group, the passes that admitted restored prefixes wait for each group before its
    layers attend (each event after its record, in group order; the attention backend's
    layers and MLA's alike), and the outputs are those of the worker without the tier."""
    source = load_model_source(model, device="cpu")
    vocab = source.config.vocab_size
    without = make_scheduler(model, source, max_total_tokens=POOL)
    base_outputs, _, _ = multi_turn(without, vocab)
    tiered = make_scheduler(model, source, max_total_tokens=POOL, kv_host_memory=0.01)
    host = tiered.tree_cache.host_pool
    log: list = []
    host._new_event = lambda: LoggedEvent(log)
    groups = max(host.layer_group) + 1
    outputs, _, _ = multi_turn(tiered, vocab)
    assert outputs == base_outputs
    made = [i for kind, i in log if kind == "made"]
    assert made and len(made) % groups == 0
    for first in range(0, len(made), groups):  # each issued restore, its groups in order
        mine = [(kind, i - first) for kind, i in log if first <= i < first + groups]
        records = [i for kind, i in mine if kind == "record"]
        waits = [i for kind, i in mine if kind == "wait"]
        assert records == list(range(groups))
        assert waits == list(range(groups)), "a layer group was not waited for in order"
        assert mine.index(("record", groups - 1)) < mine.index(("wait", 0))


def test_disk_tier_survives_a_restart_in_process(tiny_llama, tmp_path):
    source, _ = tiny_llama
    rng = random.Random(7)
    prompt = [rng.randrange(source.config.vocab_size) for _ in range(150)]
    tiers = {"kv_host_memory": 0.01, "kv_disk_path": str(tmp_path), "kv_disk_size": 0.01}
    first = make_scheduler("random:tiny-llama", source, max_total_tokens=POOL * 4, **tiers)
    before = run_to_completion(first, [prompt], greedy(NEW))["r0"]
    first.tree_cache.disk.close()
    second = make_scheduler("random:tiny-llama", source, max_total_tokens=POOL * 4, **tiers)
    after = run_to_completion(second, [prompt], greedy(NEW))["r0"]
    second.tree_cache.disk.close()
    assert after["ids"] == before["ids"]
    assert after["cached"] == 128  # two whole 64-token blocks of the 149 matched
    assert second.get_server_info()["prefix_cache_hit_tokens_by_tier"]["disk"] == 128


def test_an_adapters_disk_blocks_survive_a_restart(tiny_llama, tmp_path):
    """A LoRA adapter's prefixes on the disk tier are named by its weights: a restarted worker
    (new uids) serves them to the same adapter, with the same output, and never to another
    adapter or the base model on the same tokens."""
    source, _ = tiny_llama
    rng = random.Random(11)
    prompt = [rng.randrange(source.config.vocab_size) for _ in range(150)]
    modules = [
        f"{name}={write_random_adapter(tmp_path / name, 4, seed, TINY_LLAMA_SHAPES, 2)}"
        for seed, name in enumerate(("a", "b"))
    ]
    tiers = {"kv_host_memory": 0.01, "kv_disk_path": str(tmp_path / "kv"), "kv_disk_size": 0.01}

    def start():
        return make_scheduler(
            "random:tiny-llama", source, max_total_tokens=POOL * 4, lora_modules=modules, **tiers
        )

    first = start()
    before = run_to_completion(first, [prompt], greedy(NEW), lora_names=["a"])["r0"]
    first.tree_cache.disk.close()
    second = start()
    others = run_to_completion(second, [prompt, prompt], greedy(NEW), lora_names=["b", None])
    after = run_to_completion(second, [prompt], greedy(NEW), lora_names=["a"])["r0"]
    second.tree_cache.disk.close()
    assert [others["r0"]["cached"], others["r1"]["cached"]] == [0, 0]
    assert after["ids"] == before["ids"]
    assert after["cached"] == 128  # two whole 64-token blocks of the 149 matched


def _complete(server: ServerProcess, prompt: list[int]) -> dict:
    body = {"model": "random:tiny-llama", "prompt": prompt, "max_tokens": 4, "temperature": 0}
    request = urllib.request.Request(
        server.base_url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


def _replayed(replay_port: int, want, timeout: float = 20.0) -> list:
    """Every event the worker published since it started (its replay socket, from sequence 0),
    asked again until `want(events)` holds: a SUB joining a fresh worker may miss its first."""
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{replay_port}")
    deadline = time.monotonic() + timeout
    try:
        while True:
            dealer.send_multipart((b"", (0).to_bytes(8, "big")))
            events = []
            while True:
                assert dealer.poll(5000), "no replay answer"
                _, seq, payload = dealer.recv_multipart()
                if int.from_bytes(seq, "big", signed=True) == -1:
                    break
                events += DECODER.decode(payload).events
            if want(events) or time.monotonic() > deadline:
                return events
            time.sleep(0.2)
    finally:
        dealer.close(linger=0)
        ctx.term()


def _stored(events: list, medium: str) -> list[int]:
    return [
        h
        for e in events
        if isinstance(e, BlockStored) and e.medium == medium
        for h in e.block_hashes
    ]


@pytest.mark.slow
def test_a_restarted_server_answers_from_its_disk_tier(tmp_path):
    """...and publishes its blocks as KV events: DISK once written; the restarted worker
    announces the blocks it found (DISK) at start, then its hit stores them CPU and GPU."""
    prompt = [random.Random(3).randrange(1, 250) for _ in range(200)]
    hashes = reference_hashes(prompt, 16)[:12]  # three whole 64-token disk blocks
    disk = tmp_path / "kv"
    args = ["--model", "random:tiny-llama", "--max-total-tokens", "512"]
    args += ["--kv-host-memory", "0.01", "--kv-disk-path", str(disk), "--kv-disk-size", "0.01"]
    pub, replay = free_port(), free_port()
    args += ["--kv-events-endpoint", f"tcp://*:{pub}"]
    args += ["--kv-events-replay-endpoint", f"tcp://127.0.0.1:{replay}"]
    with ServerProcess(args, log_path=tmp_path / "first.log") as server:
        first = _complete(server, prompt)
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        deadline = time.monotonic() + 20
        while len(list(disk.rglob("*.kv"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)  # the writer thread: three whole blocks of the 200 tokens
        events = _replayed(replay, lambda ev: _stored(ev, "DISK") == hashes)
        assert _stored(events, "DISK") == hashes
        assert set(hashes) <= set(_stored(events, "GPU"))
    with ServerProcess(args, log_path=tmp_path / "second.log") as server:
        announced = _replayed(replay, lambda ev: _stored(ev, "DISK") == hashes)
        assert _stored(announced, "DISK") == hashes  # found on disk at start
        second = _complete(server, prompt)
        _, metrics = server.get("/metrics")
        events = _replayed(replay, lambda ev: set(hashes) <= set(_stored(ev, "GPU")))
        assert set(hashes) <= set(_stored(events, "CPU"))  # read into the host tier
        assert set(hashes) <= set(_stored(events, "GPU"))  # and restored to the device
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert second["choices"][0]["text"] == first["choices"][0]["text"]
    assert (
        'radixserve_prefix_cache_hits_tokens_total{model_name="random:tiny-llama",tier="disk"}'
        in metrics.decode()
    )


def test_host_tier_mirrors_the_latent_mla_pool():
    """The host tier sees only a pool's buffers: DeepSeek's latent pool (one buffer per layer,
    V a view into it) round-trips as exactly as per-layer K and V do."""
    model = "random:tiny-deepseek-v2-lite"
    source = load_model_source(model, device="cpu")
    without = make_scheduler(model, source, max_total_tokens=POOL)
    tiered = make_scheduler(model, source, max_total_tokens=POOL, kv_host_memory=0.01)
    assert type(tiered.worker.kv_pool).__name__ == "MLATokenToKVPool"
    base_outputs, base_hits, _ = multi_turn(without, source.config.vocab_size)
    outputs, hits, _ = multi_turn(tiered, source.config.vocab_size)
    assert outputs == base_outputs
    assert hits >= 2 * base_hits and hits > 0
