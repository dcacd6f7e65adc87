"""Constrained decoding on the GPU fast path: CUDA graphs, overlap scheduling, masks applied by
xgrammar's Triton kernel. Every constrained output follows its grammar and overlap changes
(almost) nothing. (That constrained batches add no host sync is test_overlap_no_sync.py's.)

The model has random weights and no tokenizer; the grammars run over the character tokenizer of
the unit tests, its ids a prefix of the model's vocabulary (the rest are never allowed).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import jsonschema
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "integration"))
sys.path.insert(0, str(TESTS / "unit"))
from char_tokenizer import make_char_tokenizer  # noqa: E402
from engine_harness import (  # noqa: E402
    greedy,
    make_scheduler,
    random_prompts,
    run_to_completion,
    token_agreement,
)
from small_models import SMALL_LLAMA, random_model  # noqa: E402

from radixserve.model_loader.loader import load_model_source  # noqa: E402
from radixserve.sampling.sampling_params import SamplingParams  # noqa: E402

TOKENIZER = make_char_tokenizer()
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "name": {"type": "string", "maxLength": 8},
        "tags": {"type": "array", "items": {"enum": ["a", "b", None]}, "maxItems": 3},
    },
    "required": ["id", "name"],
}
REGEX = r"[a-z]{2,5}-\d{2}"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    model = random_model(tmp_path_factory.mktemp("cfg"), "small-llama", SMALL_LLAMA)
    loaded = load_model_source(model, dtype="float32", device="cuda")
    return model, dataclasses.replace(loaded, tokenizer=TOKENIZER)


def workload(n: int) -> tuple[list[list[int]], list[SamplingParams]]:
    prompts = random_prompts(n, SMALL_LLAMA["vocab_size"], 8, 120, seed=21)
    params = []
    for i in range(n):
        if i % 3 == 0:
            params.append(
                SamplingParams(max_new_tokens=96, temperature=0.0, json_schema=json.dumps(SCHEMA))
            )
        elif i % 3 == 1:
            params.append(SamplingParams(max_new_tokens=24, temperature=0.7, seed=i, regex=REGEX))
        else:
            params.append(greedy(24))
    return prompts, params


def check_constrained(results: dict[str, dict], params: list[SamplingParams]) -> None:
    for i, p in enumerate(params):
        result = results[f"r{i}"]
        if p.constraint is None:
            continue
        assert result["finish"]["type"] == "stop", (i, result)
        # the grammar ends on the model's stop token, which the test tokenizer spells as text
        assert result["ids"][-1] == result["finish"]["matched"], (i, result)
        text = TOKENIZER.decode(result["ids"][:-1])
        if p.regex is not None:
            assert re.fullmatch(REGEX, text), text
        else:
            jsonschema.validate(json.loads(text), SCHEMA)


def test_constrained_rows_follow_their_grammars_under_graphs_and_overlap(source):
    model, loaded = source
    prompts, params = workload(48)
    results = {}
    for overlap in (True, False):
        scheduler = make_scheduler(
            model,
            loaded,
            device="cuda",
            dtype="float32",
            attention_backend="triton",
            disable_overlap=not overlap,
        )
        assert scheduler.overlap == overlap
        assert scheduler.worker.model_runner.cuda_graph_runner is not None
        results[overlap] = run_to_completion(scheduler, prompts, params)
        check_constrained(results[overlap], params)
    agreement = token_agreement(results[True], results[False])
    print(f"overlap on/off token agreement {agreement:.4f}")
    assert agreement > 0.98
