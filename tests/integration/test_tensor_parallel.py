"""--tp-size 2 on the CPU (gloo): two scheduler processes, each with a shard of every layer, give
the same greedy tokens as one process holding the whole model."""

from __future__ import annotations

import pytest
from engine_harness import random_prompts

from radixserve.entrypoints.engine import Engine

GREEDY = {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True}


def generate(model: str, tp_size: int, **kwargs) -> list[dict]:
    with Engine(model=model, device="cpu", tp_size=tp_size, max_total_tokens=4096) as engine:
        assert engine.get_server_info()["max_total_tokens"] == 4096
        return engine.generate(**kwargs)


@pytest.mark.parametrize("model", ["random:tiny-llama", "random:tiny-qwen2"])
def test_tp2_greedy_equals_tp1_on_tiny_models(model):
    prompts = random_prompts(8, 1024, 3, 60, seed=31)
    one = generate(model, 1, input_ids=prompts, sampling_params=GREEDY)
    two = generate(model, 2, input_ids=prompts, sampling_params=GREEDY)
    assert [o["output_ids"] for o in two] == [o["output_ids"] for o in one]


def test_tp2_greedy_equals_tp1_on_the_bundled_model():
    # SmolLM2 has 9 heads in 3 KV groups: rank 0 holds 2 groups, rank 1 one
    prompts = ["The capital of France is", "List three colours:", "def fibonacci(n):"]
    one = generate("builtin:smollm2-135m", 1, prompt=prompts, sampling_params=GREEDY)
    two = generate("builtin:smollm2-135m", 2, prompt=prompts, sampling_params=GREEDY)
    assert [o["output_ids"] for o in two] == [o["output_ids"] for o in one]
    assert "Paris" in one[0]["text"]


def test_tp2_sampling_stays_in_lockstep():
    """Unseeded sampling draws different noise per rank; rank 0's tokens are broadcast, so the
    ranks' caches agree and the request completes."""
    params = {"max_new_tokens": 24, "temperature": 1.0, "ignore_eos": True}
    outs = generate(
        "random:tiny-llama",
        2,
        input_ids=random_prompts(4, 1024, 5, 20, seed=32),
        sampling_params=params,
    )
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [24] * 4
