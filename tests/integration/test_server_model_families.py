"""A user's checkpoint of each new family, served as they would serve it: `radixserve serve
--model DIR` on a directory holding only config.json and safetensors (transformers'
save_pretrained of random weights: the per-expert `experts.N.w1` names of a real Mixtral
checkpoint, Gemma's tied embedding), driven over HTTP with `input_ids` requests to
/generate; greedy output token-identical to transformers on the same weights."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from engine_harness import hf_greedy, random_prompts

from radixserve.bench.server_process import ServerProcess
from radixserve.model_loader.loader import build_hf_reference, load_model_source

pytestmark = pytest.mark.slow
NEW = 8


# Mixtral: the per-expert w1/w2/w3 names under block_sparse_moe; Gemma 3: tied embeddings,
# local and global layers (Qwen3-MoE's checkpoint form is served in test_fp8_checkpoints.py)
@pytest.fixture(scope="module", params=["tiny-mixtral", "tiny-gemma3"])
def served(request, tmp_path_factory):
    workdir = tmp_path_factory.mktemp(request.param)
    checkpoint = workdir / "checkpoint"
    hf = build_hf_reference(load_model_source(f"random:{request.param}", device="cpu"))
    hf.save_pretrained(checkpoint)
    assert not list(checkpoint.glob("tokenizer*"))  # weights only
    args = ["--model", str(checkpoint), "--max-total-tokens", "4096"]
    args += ["--chunked-prefill-size", "16"]
    log = workdir / "server.log"
    with ServerProcess(args, log_path=log) as server:
        yield server, hf
    assert server.process.returncode == 0, log.read_text()[-3000:]


async def generate_all(server: ServerProcess, prompts: list[list[int]]) -> list[dict]:
    params = {"max_new_tokens": NEW, "temperature": 0.0, "ignore_eos": True}
    async with aiohttp.ClientSession() as session:

        async def one(ids: list[int]) -> dict:
            body = {"input_ids": ids, "sampling_params": params}
            async with session.post(server.base_url + "/generate", json=body) as reply:
                assert reply.status == 200, await reply.text()
                return await reply.json()

        return await asyncio.gather(*(one(p) for p in prompts))


def test_concurrent_input_ids_requests_match_transformers(served):
    server, hf = served
    prompts = random_prompts(16, hf.config.vocab_size, 2, 40, seed=50)
    replies = asyncio.run(generate_all(server, prompts))
    for prompt, reply in zip(prompts, replies, strict=True):
        assert reply["meta_info"]["completion_tokens"] == NEW
        assert reply["output_ids"] == hf_greedy(hf, prompt, NEW)
