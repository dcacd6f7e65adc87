"""--tp-size 2 over NCCL (needs two GPUs): float32 greedy on a random Llama-3-8B shape equals
--tp-size 1, with CUDA graphs capturing the all-reduces; LoRA adapters sharded over the two
ranks, mixed in the graphs, give PEFT's tokens."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from engine_harness import random_prompts, token_agreement  # noqa: E402

from radixserve.frontend.engine import Engine  # noqa: E402

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
    the adapters mixed in one batch, replayed in the LoRA graphs, give PEFT's greedy tokens."""
    pytest.importorskip("peft")
    from lora_adapters import tp2_engine_with_adapters

    with tp2_engine_with_adapters(tmp_path, "cuda", attention_backend="triton") as found:
        engine, got, expected, _ = found
        assert engine.get_server_info()["tp_size"] == 2
    assert got == expected
