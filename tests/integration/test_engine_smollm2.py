"""The bundled SmolLM2-135M-Instruct GGUF: greedy output identical to transformers on the same
(dequantized) weights, for chat prompts alone and 16 at once, EOS honoured."""

from __future__ import annotations

import pytest
from engine_harness import hf_greedy, make_scheduler, run_to_completion

from radixserve.model_loader.loader import build_hf_reference, load_model_source
from radixserve.sampling.sampling_params import SamplingParams

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain gravity in one sentence.",
    "Say hello.",
    "What colour is the sky on a clear day?",
    "Name a fruit that is yellow.",
    "How many legs does a spider have?",
]
NEW = 16


@pytest.fixture(scope="module")
def smollm2():
    source = load_model_source("builtin:smollm2-135m", device="cpu")
    tok = source.tokenizer
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
        for q in QUESTIONS
    ]
    prompts = [p if isinstance(p, list) else p["input_ids"] for p in prompts]
    return source, build_hf_reference(source), prompts


def test_bundled_model_matches_transformers(smollm2):
    source, hf, prompts = smollm2
    # 16 requests: every question twice, the second copy sharing the first's cached prefix
    batch = prompts + prompts
    scheduler = make_scheduler("builtin:smollm2-135m", source, chunked_prefill_size=64)
    params = SamplingParams(max_new_tokens=NEW, temperature=0.0)
    results = run_to_completion(scheduler, batch, params)
    expected_by_prompt = [hf_greedy(hf, prompt, NEW, eos=True) for prompt in prompts]
    for i in range(len(batch)):
        expected = expected_by_prompt[i % len(prompts)]
        got = results[f"r{i}"]
        assert got["ids"] == expected, f"prompt {i % len(prompts)} differs"
        if got["finish"]["type"] == "stop":
            assert got["ids"][-1] in source.config.eos_token_ids
    text = source.tokenizer.decode(results["r0"]["ids"], skip_special_tokens=True)
    assert "Paris" in text
    assert scheduler.get_server_info()["prefix_cache_hit_tokens"] > 0
