"""A poisoned request on the real model worker ends alone; the batch beside it is unchanged.

The scheduler runs in-process over a real model (random tiny Llama on the CPU): a request whose
sampling parameter no tensor can hold (top_k = 2**63, which the front end's verify refuses, set
here after it) is admitted with others. It ends with an internal error; greedy and seeded
sampled requests beside it produce exactly the tokens they produce without it, and every KV
slot and request row comes back.
"""

from __future__ import annotations

import pytest
from engine_harness import make_scheduler, random_prompts, run_to_completion

from radixserve.model_loader.loader import load_model_source
from radixserve.sampling.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def source():
    return load_model_source("random:tiny-llama", device="cpu")


def test_a_poisoned_request_ends_alone_and_the_others_are_unchanged(source):
    prompts = random_prompts(4, source.config.vocab_size, 5, 30, seed=11)
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
    sampled = SamplingParams(
        max_new_tokens=12, temperature=0.9, top_k=40, seed=7, ignore_eos=True, logit_bias={5: 2.0}
    )
    poison = SamplingParams(max_new_tokens=12, temperature=0.9, ignore_eos=True)
    poison.top_k = 2**63
    clean = run_to_completion(
        make_scheduler("random:tiny-llama", source), prompts[:3], [greedy, sampled, greedy]
    )
    scheduler = make_scheduler("random:tiny-llama", source)
    results = run_to_completion(
        scheduler,
        [prompts[0], prompts[1], prompts[3], prompts[2]],
        [greedy, sampled, poison, greedy],
    )
    assert results["r2"]["ids"] == []
    assert results["r2"]["finish"]["type"] == "error"
    assert results["r2"]["finish"]["message"].startswith("internal error: ValueError")
    assert "param" not in results["r2"]["finish"]
    assert results["r0"] == clean["r0"]
    assert results["r1"] == clean["r1"]
    assert results["r3"] == clean["r2"]
    info = scheduler.get_server_info()
    assert info["protected_size"] == 0
    assert info["free_slots"] + info["evictable_size"] == info["max_total_tokens"]
    assert scheduler.flush_cache()
    assert scheduler.get_server_info()["free_slots"] == info["max_total_tokens"]
    # the scheduler serves on
    again = run_to_completion(scheduler, [prompts[0]], greedy)
    assert again["r0"]["ids"] == clean["r0"]["ids"]
