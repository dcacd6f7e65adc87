"""--tp-size 2 over NCCL (needs two GPUs): float32 greedy on a random Llama-3-8B shape equals
--tp-size 1, with CUDA graphs capturing the all-reduces; LoRA adapters sharded over the two
ranks, mixed in the graphs, give PEFT's tokens."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from engine_harness import random_prompts, token_agreement  # noqa: E402

from radixserve.frontend.engine import Engine  # noqa: E402
from radixserve.model_loader.loader import build_hf_reference, load_model_source  # noqa: E402

# the lent machines forbid NVLink multicast (see the device README)
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")


def generate(tp_size: int, prompts: list[list[int]]) -> dict[str, dict]:
    with Engine(
        model="random:llama-3-8b",
        device="cuda",
        dtype="float32",
        tp_size=tp_size,
        context_length=2048,
        attention_backend="triton",
        max_total_tokens=65536,
    ) as engine:
        outs = engine.generate(
            input_ids=prompts,
            sampling_params={"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True},
        )
    return {f"r{i}": {"ids": o["output_ids"]} for i, o in enumerate(outs)}


def test_tp2_matches_tp1_fp32_8b_shape():
    prompts = random_prompts(16, 128256, 16, 400, seed=41)
    one, two = generate(1, prompts), generate(2, prompts)
    agreement = token_agreement(two, one)
    print(f"TP=2 vs TP=1 fp32 agreement {agreement:.4f}")
    assert agreement >= 0.99


def test_tp2_lora_adapters_in_cuda_graphs_give_pefts_tokens(tmp_path):
    """Each rank holds its part of the three adapters (lora/pool.rank_parts); the base and
    the adapters mixed in one batch, replayed in the LoRA graphs, give PEFT's greedy tokens.
    Random weights are drawn on the device they are for: the reference holds the CUDA draw."""
    pytest.importorskip("peft")
    from lora_adapters import ADAPTERS, peft_greedy, save_adapter

    source = load_model_source("random:tiny-llama", device="cuda", dtype="float32")
    hf = build_hf_reference(source).cpu()
    dirs = {
        name: save_adapter(hf, tmp_path / name, rank, alpha, targets, seed)
        for seed, (name, rank, alpha, targets) in enumerate(ADAPTERS)
    }
    prompts = random_prompts(2, source.config.vocab_size, 5, 30, seed=33)
    jobs = [(name, p) for name in [None, *dirs] for p in prompts]
    expected = [peft_greedy(hf, dirs.get(name), p, 8) for name, p in jobs]
    params = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    with Engine(
        model="random:tiny-llama",
        device="cuda",
        dtype="float32",
        tp_size=2,
        attention_backend="triton",
        max_total_tokens=4096,
        lora_modules=[f"{name}={path}" for name, path in dirs.items()],
        max_loras=3,
    ) as engine:

        async def all_at_once() -> list[dict]:
            return await asyncio.gather(
                *(
                    engine.async_generate(input_ids=p, sampling_params=params, lora_name=name)
                    for name, p in jobs
                )
            )

        outs = asyncio.run(all_at_once())
    assert [o["output_ids"] for o in outs] == expected
