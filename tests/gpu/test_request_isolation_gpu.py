"""A poisoned request on the GPU, with CUDA graphs and overlap scheduling: it ends alone with an
internal error, arriving while a batch decodes (the running batch stays in flight on the
device), and the requests beside it decode exactly what they decode without it; every KV slot
and request row comes back. A request whose stop check raises mid-decode ends alone the same.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from engine_harness import make_scheduler, random_prompts  # noqa: E402
from small_models import SMALL_LLAMA, random_model  # noqa: E402

from radixserve.boundary import TokenizedGenerateReqInput  # noqa: E402
from radixserve.model_loader.loader import load_model_source  # noqa: E402
from radixserve.sampling.sampling_params import SamplingParams  # noqa: E402
from radixserve.scheduler.schedule_batch import Req  # noqa: E402

GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_new_tokens=24, temperature=0.8, top_k=20, seed=3, ignore_eos=True)


def poisoned_params() -> SamplingParams:
    params = SamplingParams(max_new_tokens=24, temperature=0.7, ignore_eos=True)
    params.top_k = 2**63  # what verify refuses; torch's int64 column cannot hold it
    return params


def run(scheduler, first, later, arrive_at: int = 4) -> dict[str, dict]:
    """Submit `first`, step; at step `arrive_at` submit `later` (mid-decode); until idle."""
    for rid, ids, params in first:
        scheduler.handle_generate_request(TokenizedGenerateReqInput(rid, ids, params))
    results: dict[str, dict] = {}
    steps = 0
    while scheduler.has_work() or steps <= arrive_at:
        scheduler.step()
        steps += 1
        if steps == arrive_at:
            for rid, ids, params in later:
                scheduler.handle_generate_request(TokenizedGenerateReqInput(rid, ids, params))
        for out in scheduler.pop_outputs():
            entry = results.setdefault(out.rid, {"ids": [], "finish": None})
            entry["ids"].extend(out.new_token_ids)
            entry["finish"] = out.finished_reason
    return results


def assert_memory_back(scheduler) -> None:
    info = scheduler.get_server_info()
    assert info["protected_size"] == 0
    assert info["free_slots"] + info["evictable_size"] == info["max_total_tokens"]
    pool = scheduler.worker.model_runner.req_to_token_pool
    assert pool.available_size() == pool.size
    assert scheduler.flush_cache()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model = random_model(tmp_path_factory.mktemp("iso"), "small-llama", SMALL_LLAMA)
    source = load_model_source(model, dtype="bfloat16", device="cuda")
    return model, source


def test_a_poisoned_arrival_mid_decode_ends_alone(setup):
    model, source = setup
    prompts = random_prompts(5, source.config.vocab_size, 5, 40, seed=4)
    first = [("a0", prompts[0], GREEDY), ("a1", prompts[1], SEEDED)]
    later = [("b0", prompts[2], GREEDY), ("b1", prompts[3], SEEDED)]
    clean_scheduler = make_scheduler(model, source, device="cuda", dtype="bfloat16")
    assert clean_scheduler.overlap and clean_scheduler.worker.model_runner.cuda_graph_runner
    clean = run(clean_scheduler, first, later)
    scheduler = make_scheduler(model, source, device="cuda", dtype="bfloat16")
    poisoned = run(
        scheduler, first, [later[0], ("poison", prompts[4], poisoned_params()), later[1]]
    )
    assert poisoned["poison"]["ids"] == []
    assert poisoned["poison"]["finish"]["message"].startswith("internal error: ValueError")
    for rid in ("a0", "a1", "b0", "b1"):
        assert poisoned[rid] == clean[rid], rid
    assert_memory_back(scheduler)


def test_a_stop_check_that_raises_mid_decode_ends_alone(setup, monkeypatch):
    model, source = setup
    check_finished = Req.check_finished

    def poisoned(self, context_len, tokenizer):
        if self.rid == "poison" and len(self.output_ids) == 6:
            raise KeyError("a stop check that breaks")
        return check_finished(self, context_len, tokenizer)

    prompts = random_prompts(3, source.config.vocab_size, 5, 40, seed=5)
    first = [("a0", prompts[0], GREEDY), ("a1", prompts[1], SEEDED)]
    clean = run(make_scheduler(model, source, device="cuda", dtype="bfloat16"), first, [])
    monkeypatch.setattr(Req, "check_finished", poisoned)
    scheduler = make_scheduler(model, source, device="cuda", dtype="bfloat16")
    results = run(scheduler, [*first, ("poison", prompts[2], GREEDY)], [])
    assert (
        results["poison"]["finish"]["message"]
        == "internal error: KeyError: 'a stop check that breaks'"
    )
    assert results["a0"] == clean["a0"] and results["a1"] == clean["a1"]
    assert_memory_back(scheduler)
