"""Sampling through the scheduler: per-request seeds reproduce whatever the batch, stop token
ids and min_new_tokens end generation where they should, and logprobs are transformers'."""

from __future__ import annotations

import json

import pytest
import torch
from engine_harness import hf_greedy, make_scheduler, random_prompts, run_to_completion

from radixserve.boundary import TokenizedGenerateReqInput
from radixserve.model_loader.loader import build_hf_reference, load_model_source
from radixserve.sampling.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tiny():
    source = load_model_source("random:tiny-llama", device="cpu")
    return source, build_hf_reference(source)


def test_seeded_sampling_is_reproducible_across_batches(tiny):
    source, _ = tiny
    prompts = random_prompts(6, source.config.vocab_size, 4, 30, seed=21)
    seeded = SamplingParams(max_new_tokens=16, temperature=0.9, top_p=0.95, seed=1234)
    alone = run_to_completion(make_scheduler("random:tiny-llama", source), [prompts[0]], seeded)
    # the same request, now third in a batch of strangers with their own settings
    others = [SamplingParams(max_new_tokens=16, temperature=1.2, top_k=20) for _ in range(5)]
    batch = [prompts[1], prompts[2], prompts[0], *prompts[3:]]
    params = [others[0], others[1], seeded, *others[2:]]
    together = run_to_completion(make_scheduler("random:tiny-llama", source), batch, params)
    assert together["r2"]["ids"] == alone["r0"]["ids"]
    unseeded = run_to_completion(
        make_scheduler("random:tiny-llama", source),
        [prompts[0]] * 2,
        SamplingParams(max_new_tokens=16, temperature=0.9),
    )
    assert unseeded["r0"]["ids"] != unseeded["r1"]["ids"]


def test_stop_token_ids_and_min_new_tokens(tiny, greedy):
    source, hf = tiny
    prompt = random_prompts(1, source.config.vocab_size, 12, 12, seed=22)[0]
    free = hf_greedy(hf, prompt, 20)
    stop_at = free[5]
    first = free.index(stop_at)
    results = run_to_completion(
        make_scheduler("random:tiny-llama", source),
        [prompt, prompt],
        [
            greedy(20, stop_token_ids=[stop_at]),
            greedy(20, stop_token_ids=[stop_at], min_new_tokens=first + 2),
        ],
    )
    assert results["r0"]["ids"] == free[: first + 1]
    assert results["r0"]["finish"] == {"type": "stop", "matched": stop_at}
    # while fewer than min_new_tokens exist, the stop token is masked out of the choice
    masked = results["r1"]["ids"]
    assert stop_at not in masked[: first + 2] and len(masked) > first + 1


def test_logprobs_are_transformers_log_softmax(tiny):
    source, hf = tiny
    prompt = random_prompts(1, source.config.vocab_size, 10, 10, seed=23)[0]
    scheduler = make_scheduler("random:tiny-llama", source)
    scheduler.handle_generate_request(
        TokenizedGenerateReqInput(
            rid="lp",
            input_ids=prompt,
            sampling_params=SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True),
            return_logprob=True,
            top_logprobs_num=3,
        )
    )
    logprobs = []
    while scheduler.has_work():
        scheduler.step()
        for out in scheduler.pop_outputs():
            logprobs += out.logprobs or []
    assert len(logprobs) == 4
    ids = list(prompt)
    for entry in logprobs:
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0, -1].float(), -1)
        assert entry.token_id == int(ref.argmax())
        assert entry.logprob == pytest.approx(float(ref[entry.token_id]), abs=1e-4)
        top_ids = [t for t, _ in entry.top]
        assert top_ids == ref.topk(3).indices.tolist()
        ids.append(entry.token_id)


def test_llama3_rope_scaling_matches_transformers(tmp_path, greedy):
    config = {
        "model_type": "llama",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "max_position_embeddings": 4096,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    }
    path = tmp_path / "llama3.json"
    path.write_text(json.dumps(config))
    model = f"random:{path}"
    source = load_model_source(model, device="cpu")
    hf = build_hf_reference(source)
    prompts = random_prompts(4, 512, 60, 120, seed=24)  # past the original 64 positions
    results = run_to_completion(make_scheduler(model, source), prompts, greedy(10))
    for i, prompt in enumerate(prompts):
        assert results[f"r{i}"]["ids"] == hf_greedy(hf, prompt, 10)
