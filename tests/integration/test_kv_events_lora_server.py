"""A LoRA adapter's KV events from a real worker, read as llm-d or Dynamo would and followed by
`radixserve router --prefix-source events`: a prompt run under the adapter publishes its blocks
with the raw token ids, the adapter's name and uid, and vLLM's `(name,)` extra keys, hashed as
vLLM hashes a LoRA request's blocks; the router then routes the adapter's request for that
prompt by prefix, and the base model's request for the same prompt not."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
import zmq
from lora_adapters import TINY_LLAMA_LAYERS, TINY_LLAMA_SHAPES, write_random_adapter
from router_harness import routing_decisions
from tests.unit.vllm_kv_events import DECODER, BlockStored, reference_hashes

from radixserve.bench.router import started_router
from radixserve.bench.server_process import ServerProcess, free_port

pytestmark = pytest.mark.slow

BLOCK = 16
PROMPT = [(29 * i) % 900 + 5 for i in range(64)]  # 4 blocks; vocab 1024


def post(url: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


def generate(url: str, input_ids: list[int], model: str | None = None) -> dict:
    body = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}
    return post(url, "/generate", body if model is None else {**body, "model": model})


def router_info(router: ServerProcess) -> dict:
    return json.loads(router.get("/get_server_info")[1])["router"]


def router_blocks(router: ServerProcess, worker: str) -> int:
    return router_info(router)["kv_events"]["blocks"].get(worker, 0)


def wait_for(condition, what: str, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_an_adapters_blocks_are_named_and_routed_by_the_adapter(tmp_path) -> None:  # type: ignore[no-untyped-def]
    adapter = write_random_adapter(tmp_path / "sql", 4, 1, TINY_LLAMA_SHAPES, TINY_LLAMA_LAYERS)
    port = free_port()
    args = ["--model", "random:tiny-llama", "--max-total-tokens", "2048"]
    args += ["--lora-modules", f"sql={adapter}", "--max-lora-rank", "4"]
    args += ["--kv-events-endpoint", f"tcp://*:{port}"]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    try:
        with ServerProcess(args, log_path=tmp_path / "worker.log") as worker:
            url = worker.base_url
            base = json.loads(worker.get("/v1/models")[1])["data"][0]["id"]
            router_args = ["--policy", "cache_aware", "--prefix-source", "events"]
            router_args += ["--health-check-interval", "0.3"]
            with started_router([url], router_args, tmp_path / "router.log") as router:
                # the router's subscription has joined once it sees a base prompt's blocks
                warm_up = iter(range(1000))
                wait_for(
                    lambda: (
                        generate(url, [next(warm_up) + 3] * BLOCK)
                        and router_blocks(router, url) > 0
                    ),
                    "the router's subscription",
                )
                # and it hashes the adapter's requests once it has read the worker's models
                wait_for(lambda: "sql" in router_info(router).get("lora_adapters", []), "sql")
                held = router_blocks(router, url)

                generate(url, PROMPT, "sql")  # behind the router's back: only events tell
                stored: list[BlockStored] = []
                wait_for(lambda: _read_adapter_blocks(sub, stored) >= 4, "the adapter's blocks")
                assert [h for e in stored for h in e.block_hashes] == reference_hashes(
                    PROMPT, BLOCK, ["sql"]
                )
                assert [t for e in stored for t in e.token_ids] == PROMPT
                assert {(e.lora_id, e.lora_name, e.medium) for e in stored} == {(1, "sql", "GPU")}
                assert [k for e in stored for k in e.extra_keys or []] == [("sql",)] * 4
                wait_for(lambda: router_blocks(router, url) >= held + 4, "the router's index")

                generate(router.base_url, PROMPT, "sql")
                assert routing_decisions(router) == {"prefix": 1}
                generate(router.base_url, PROMPT, base)  # the base model's blocks differ
                assert routing_decisions(router) == {"prefix": 1, "least_loaded": 1}
    finally:
        sub.close(linger=0)
        ctx.term()


def _read_adapter_blocks(sub: zmq.Socket, stored: list[BlockStored]) -> int:
    """Reads what has arrived; adds the adapter's BlockStored events to `stored`; its blocks."""
    while sub.poll(0):
        _, _, payload = sub.recv_multipart()
        events = DECODER.decode(payload).events
        stored += [e for e in events if isinstance(e, BlockStored) and e.lora_name is not None]
    return sum(len(e.block_hashes) for e in stored)
