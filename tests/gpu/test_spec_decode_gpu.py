"""Speculative decoding on the GPU (CUDA graphs replaying the verify step as decode rows,
overlap between the steps that do not speculate): greedy tokens identical with and without it,
seeded sampling too, and every KV slot given back."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from engine_harness import greedy, make_scheduler, random_prompts, run_to_completion  # noqa: E402
from small_models import SMALL_LLAMA, random_model  # noqa: E402

from radixserve.model_loader.loader import load_model_source  # noqa: E402
from radixserve.sampling.sampling_params import SamplingParams  # noqa: E402

SPEC = {"speculative_method": "ngram"}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return random_model(tmp_path_factory.mktemp("cfg"), "small-llama", SMALL_LLAMA)


def copy_heavy(n: int) -> list[list[int]]:
    base = random_prompts(n, SMALL_LLAMA["vocab_size"], 20, 120, seed=4)
    return [p + p[: len(p) // 2] + p for p in base]


def generate(model_path, prompts, params, **kw):
    source = load_model_source(model_path, dtype="float32", device="cuda")
    scheduler = make_scheduler(
        model_path, source, device="cuda", dtype="float32", max_total_tokens=20000, **kw
    )
    return run_to_completion(scheduler, prompts, params), scheduler


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("k", [4, 16])
def test_graphs_and_overlap_identical_with_speculation(model_path, backend, k):
    # 24 rows: above the default batch-size limit (16) at first; their lengths differ, so the
    # batch falls below it as they finish and the rest speculate (had they one length, they
    # would end together and none would). k = 16: 16 requests' 17 rows each pass the decode
    # graphs' and the future ring's width (256): the proposals are trimmed to it
    prompts = copy_heavy(24)
    params = [greedy(16 + 8 * i) for i in range(12)] + [
        SamplingParams(
            max_new_tokens=40 + 8 * i, temperature=0.8, top_p=0.95, seed=i, ignore_eos=True
        )
        for i in range(12)
    ]
    plain, _ = generate(model_path, prompts, params, attention_backend=backend)
    spec, scheduler = generate(
        model_path, prompts, params, attention_backend=backend, speculative_num_tokens=k, **SPEC
    )
    assert scheduler.worker.model_runner.cuda_graph_runner is not None and scheduler.overlap
    info = scheduler.get_server_info()
    assert info["forward_steps_by_mode"]["verify"] > 0 and info["spec_accepted_tokens"] > 0
    for rid, entry in plain.items():
        assert spec[rid]["ids"] == entry["ids"], rid
    assert info["protected_size"] == 0
    assert info["free_slots"] + info["evictable_size"] == info["max_total_tokens"]
