"""Overlap scheduling only pays if forming and launching a batch never waits for the device.

The scheduler steps under torch's sync debug mode set to "error": any host sync other than the
one that fetches a launched batch's tokens (`PendingBatchResult.resolve`) fails the test. New
requests arrive while others decode, so prefill, mixed-in sampling options, constrained rows
(JSON Schema masks filled after the previous batch's fetch, copied and applied without a wait)
and decode batches are all formed under the check.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from char_tokenizer import make_char_tokenizer  # noqa: E402
from engine_harness import greedy, make_scheduler, random_prompts  # noqa: E402
from small_models import SMALL_LLAMA, random_model  # noqa: E402

from radixserve.boundary import TokenizedGenerateReqInput  # noqa: E402
from radixserve.model_loader.loader import load_model_source  # noqa: E402
from radixserve.sampling.sampling_params import SamplingParams  # noqa: E402
from radixserve.scheduler import tp_worker  # noqa: E402

SCHEMA = json.dumps({"type": "array", "items": {"type": "integer"}, "maxItems": 50})


def submit(scheduler, prompts, tag: str) -> None:
    params = [
        greedy(24),
        SamplingParams(max_new_tokens=24, temperature=0.8, top_p=0.9, top_k=20, seed=1),
        SamplingParams(max_new_tokens=24, temperature=0.0, repetition_penalty=1.2),
        SamplingParams(max_new_tokens=24, temperature=0.0, json_schema=SCHEMA, logit_bias={5: 2}),
    ]
    for i, ids in enumerate(prompts):
        scheduler.handle_generate_request(
            TokenizedGenerateReqInput(
                rid=f"{tag}{i}", input_ids=ids, sampling_params=params[i % len(params)]
            )
        )


@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
def test_forming_and_launching_batches_never_syncs(monkeypatch, tmp_path, backend):
    if backend == "flashinfer":
        pytest.importorskip("flashinfer")
    model = random_model(tmp_path, "small-llama", SMALL_LLAMA)
    # the grammar's vocabulary: the character tokenizer's ids, a prefix of the model's
    source = dataclasses.replace(
        load_model_source(model, dtype="bfloat16", device="cuda"), tokenizer=make_char_tokenizer()
    )
    scheduler = make_scheduler(
        model, source, device="cuda", dtype="bfloat16", attention_backend=backend
    )
    assert scheduler.overlap and scheduler.worker.model_runner.cuda_graph_runner is not None
    vocab = source.config.vocab_size
    # warm-up outside the check: kernel compilation, allocator growth and the grammar's first
    # compile may sync (the grammar is cached for the checked part)
    submit(scheduler, random_prompts(6, vocab, 5, 40, seed=1), "warm")
    while scheduler.has_work():
        scheduler.step()

    resolve = tp_worker.PendingBatchResult.resolve

    def resolve_may_sync(self):
        torch.cuda.set_sync_debug_mode(0)
        try:
            return resolve(self)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(tp_worker.PendingBatchResult, "resolve", resolve_may_sync)
    submit(scheduler, random_prompts(6, vocab, 5, 40, seed=2), "a")
    steps = 0
    torch.cuda.set_sync_debug_mode("error")
    try:
        while scheduler.has_work():
            scheduler.step()
            steps += 1
            if steps == 5:  # arrivals while the first wave decodes
                submit(scheduler, random_prompts(6, vocab, 5, 40, seed=3), "b")
    finally:
        torch.cuda.set_sync_debug_mode(0)
    finished = [o for o in scheduler.pop_outputs() if o.finished_reason]
    assert len({o.rid for o in finished if not o.rid.startswith("warm")}) == 12
    assert steps > 24
