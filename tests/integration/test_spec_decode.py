"""Speculative decoding (--speculative-method ngram) changes no output: greedy tokens identical
to transformers and to the engine without speculation, seeded sampling identical token for
token, logprobs equal, through the radix cache, chunked prefill, retraction, overlap's
bookkeeping, a json_schema request and stop strings in the same batch; and the KV slots of
rejected proposals are all given back."""

from __future__ import annotations

import gc
import json

import jsonschema
import pytest
from engine_harness import check_against_hf, greedy, hf_greedy, make_scheduler, random_prompts

from radixserve.boundary import TokenizedGenerateReqInput
from radixserve.model_loader.loader import build_hf_reference, load_model_source
from radixserve.sampling.sampling_params import SamplingParams

SPEC = {"speculative_method": "ngram", "speculative_num_tokens": 4}


def run(scheduler, prompts, params, logprobs=(), overlap=False) -> dict[str, dict]:
    """Submit every prompt (rows in `logprobs` ask for them, with 3 alternatives), step until
    idle; rid -> ids, finish and logprobs."""
    scheduler.overlap = overlap
    for i, (ids, p) in enumerate(zip(prompts, params, strict=True)):
        scheduler.handle_generate_request(
            TokenizedGenerateReqInput(
                rid=f"r{i}",
                input_ids=ids,
                sampling_params=p,
                return_logprob=i in logprobs,
                top_logprobs_num=3 if i in logprobs else 0,
            )
        )
    results: dict[str, dict] = {}
    for _ in range(10_000):
        if scheduler.waiting_only_in_background():
            scheduler.wait_in_background(timeout=60)
        scheduler.step()
        for out in scheduler.pop_outputs():
            entry = results.setdefault(out.rid, {"ids": [], "finish": None, "logprobs": []})
            entry["ids"].extend(out.new_token_ids)
            entry["finish"] = out.finished_reason
            entry["logprobs"].extend(out.logprobs or [])
        if not scheduler.has_work():
            break
    scheduler.overlap = False
    return results


def assert_memory_back(scheduler) -> None:
    info = scheduler.get_server_info()
    assert info["protected_size"] == 0
    assert info["free_slots"] + info["evictable_size"] == info["max_total_tokens"]


def copy_heavy(vocab: int, n: int, seed: int) -> list[list[int]]:
    """Prompts whose pieces repeat, so that prompt lookup finds something to propose."""
    base = random_prompts(n, vocab, 8, 20, seed=seed)
    return [p + p[: len(p) // 2] + p for p in base]


@pytest.fixture(scope="module")
def tiny_llama():
    source = load_model_source("random:tiny-llama", device="cpu")
    return source, build_hf_reference(source)


@pytest.mark.parametrize("k", [4, 16])
@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_greedy_matches_transformers_with_cache_and_chunks(tiny_llama, overlap, k):
    source, hf = tiny_llama
    vocab = source.config.vocab_size
    prompts = copy_heavy(vocab, 6, seed=11)
    prompts += [prompts[0] + prompts[1][:5]]  # shares a cached prefix with prompt 0
    new = 24
    spec = SPEC | {"speculative_num_tokens": k}
    scheduler = make_scheduler("random:tiny-llama", source, chunked_prefill_size=16, **spec)
    first = run(scheduler, prompts, [greedy(new)] * len(prompts), overlap=overlap)
    check_against_hf(hf, prompts, first, new)
    again = run(scheduler, prompts, [greedy(new)] * len(prompts), overlap=overlap)
    assert {k: v["ids"] for k, v in again.items()} == {k: v["ids"] for k, v in first.items()}
    info = scheduler.get_server_info()
    assert info["forward_steps_by_mode"]["verify"] > 0
    assert info["spec_accepted_tokens"] > 0
    assert info["prefix_cache_hit_tokens"] > 0
    assert_memory_back(scheduler)


def test_retraction_under_kv_pressure(tiny_llama):
    source, hf = tiny_llama
    prompts = copy_heavy(source.config.vocab_size, 16, seed=5)
    new = 40
    # optimistic admission into too little KV: decode steps run short and retract
    scheduler = make_scheduler(
        "random:tiny-llama", source, max_total_tokens=700, new_token_ratio=0.05, **SPEC
    )
    results = run(scheduler, prompts, [greedy(new)] * len(prompts))
    info = scheduler.get_server_info()
    assert info["num_retractions"] > 0 and info["spec_proposed_tokens"] > 0
    check_against_hf(hf, prompts, results, new)
    assert_memory_back(scheduler)


@pytest.mark.parametrize("k", [4, 16])
def test_seeded_sampling_penalties_and_logprobs_unchanged(tiny_llama, k):
    """The verify step samples each position with the noise a plain decode of that token
    draws and the penalties (repetition, frequency, presence, logit_bias, min_new_tokens) of the
    tokens before it: every row emits the same tokens, with the same logprobs."""
    source, _ = tiny_llama
    prompts = copy_heavy(source.config.vocab_size, 8, seed=3)
    params = [
        SamplingParams(max_new_tokens=20, temperature=0.7, top_p=0.9, seed=1, ignore_eos=True),
        SamplingParams(max_new_tokens=20, temperature=1.0, top_k=5, seed=2, ignore_eos=True),
        SamplingParams(max_new_tokens=20, temperature=0.0, frequency_penalty=0.5, ignore_eos=True),
        greedy(20),
        SamplingParams(max_new_tokens=20, temperature=0.0, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(max_new_tokens=20, temperature=0.8, presence_penalty=1.0, seed=5),
        SamplingParams(max_new_tokens=20, temperature=0.0, min_new_tokens=12, logit_bias={7: 5.0}),
        SamplingParams(max_new_tokens=20, temperature=0.0, frequency_penalty=-1.0, ignore_eos=True),
    ]
    results = {}
    for spec in ({}, SPEC | {"speculative_num_tokens": k}):
        scheduler = make_scheduler("random:tiny-llama", source, **spec)
        results[bool(spec)] = run(scheduler, prompts, params, logprobs=(0, 3))
        assert_memory_back(scheduler)
    assert scheduler.get_server_info()["spec_accepted_tokens"] > 0
    plain, speculative = results[False], results[True]
    for rid, entry in plain.items():
        assert speculative[rid]["ids"] == entry["ids"], rid
    for rid in ("r0", "r3"):
        for a, b in zip(plain[rid]["logprobs"], speculative[rid]["logprobs"], strict=True):
            assert a.token_id == b.token_id
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
            assert len(a.top) == 3 and [t for t, _ in a.top] == [t for t, _ in b.top]


@pytest.fixture(scope="module")
def smollm2():
    return load_model_source("builtin:smollm2-135m", device="cpu")


def chat_ids(tok, text: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return ids if isinstance(ids, list) else ids["input_ids"]


def test_bundled_model_copies_json_under_its_grammar(smollm2):
    """A constrained request proposes what its grammar accepts (the matcher walks the proposals
    and is rolled back), and the verify step masks each position as its grammar stands there."""
    record = '{"city": "Paris", "country": "France", "population": 2102650, "capital": true}'
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "country": {"type": "string"},
            "population": {"type": "integer"},
            "capital": {"type": "boolean"},
        },
        "required": ["city", "country", "population", "capital"],
    }
    prompt = chat_ids(smollm2.tokenizer, f"Repeat this JSON exactly: {record}")
    params = [SamplingParams(max_new_tokens=40, temperature=0.0, json_schema=json.dumps(schema))]
    results = {}
    for spec in ({}, SPEC):
        scheduler = make_scheduler("builtin:smollm2-135m", smollm2, **spec)
        results[bool(spec)] = run(scheduler, [prompt], params)
        assert_memory_back(scheduler)
    assert results[True]["r0"]["ids"] == results[False]["r0"]["ids"]
    assert results[True]["r0"]["finish"] == results[False]["r0"]["finish"]
    text = smollm2.tokenizer.decode(results[True]["r0"]["ids"], skip_special_tokens=True)
    jsonschema.validate(json.loads(text), schema)
    assert scheduler.get_server_info()["spec_accepted_tokens"] >= 10


def test_bundled_model_json_schema_and_stop_strings_in_one_batch(smollm2):
    source = smollm2
    tok = source.tokenizer

    def chat(text: str) -> list[int]:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True
        )
        return ids if isinstance(ids, list) else ids["input_ids"]

    poem = "Roses are red, violets are blue, sugar is sweet, and so are you."
    schema = json.dumps(
        {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}},
            "required": ["city"],
        }
    )
    prompts = [
        chat(f"Repeat this exactly: {poem}"),
        chat("Describe Paris as JSON."),
        chat(f"Repeat this exactly: {poem}"),
        chat("Count from one to ten in words."),
    ]
    params = [
        SamplingParams(max_new_tokens=24, temperature=0.0),
        SamplingParams(max_new_tokens=24, temperature=0.0, json_schema=schema),
        SamplingParams(max_new_tokens=24, temperature=0.0, stop=["sweet"]),
        SamplingParams(max_new_tokens=16, temperature=0.0, stop=[" five"]),
    ]
    results = {}
    for spec in ({}, SPEC):
        scheduler = make_scheduler("builtin:smollm2-135m", source, chunked_prefill_size=32, **spec)
        results[bool(spec)] = run(scheduler, prompts, params)
        assert_memory_back(scheduler)
    plain, speculative = results[False], results[True]
    for rid, entry in plain.items():
        assert (speculative[rid]["ids"], speculative[rid]["finish"]) == (
            entry["ids"],
            entry["finish"],
        ), rid
    assert plain["r2"]["finish"] == {"type": "stop", "matched": "sweet"}
    text = tok.decode(plain["r1"]["ids"], skip_special_tokens=True)
    jsonschema.validate(json.loads(text), json.loads(schema))
    hf = build_hf_reference(source)
    assert plain["r0"]["ids"] == hf_greedy(hf, prompts[0], 24, eos=True)[: len(plain["r0"]["ids"])]
    assert scheduler.get_server_info()["spec_accepted_tokens"] >= 8


@pytest.mark.parametrize(
    ("draft", "all_accepted"),
    [("random:tiny-llama", True), ("random:tiny-qwen2", False)],
    ids=["itself", "another-model"],
)
def test_draft_model_proposals(tiny_llama, draft, all_accepted):
    """--speculative-method draft: the target drafting for itself has every proposal accepted;
    a draft that agrees with nothing changes no token either. Both KV pools are all back."""
    source, hf = tiny_llama
    prompts = random_prompts(6, source.config.vocab_size, 10, 40, seed=3)
    prompts += [prompts[0] + prompts[1][:5]]
    scheduler = make_scheduler(
        "random:tiny-llama",
        source,
        chunked_prefill_size=16,
        speculative_method="draft",
        speculative_draft_model=draft,
        speculative_draft_max_tokens=2048,
    )
    proposer = scheduler.speculator.proposer
    catch_ups = []  # the steps after a request's first catch up as decode rows, not an extend
    catch_up = proposer._catch_up
    proposer._catch_up = lambda *a: catch_ups.append(a[2]) or catch_up(*a)
    results = run(scheduler, prompts, [greedy(20)] * len(prompts))
    check_against_hf(hf, prompts, results, 20)
    assert catch_ups and max(max(lens) for lens in catch_ups) <= 2
    info = scheduler.get_server_info()
    assert info["spec_proposed_tokens"] > 0
    assert (info["spec_accepted_tokens"] == info["spec_proposed_tokens"]) == all_accepted
    assert_memory_back(scheduler)
    del results
    gc.collect()  # finished requests are released by their finalizers, applied at a step
    proposer.propose([], [], [])
    assert proposer.runner.allocator.available_size() == proposer.runner.max_total_tokens
    assert not proposer.rows


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_lora_rows_verify_with_their_adapters(tiny_llama, tmp_path, method):
    """Speculation with LoRA adapters: a verify step's rows carry their request's slot, and a
    draft model proposes with its own weights (no adapter) while the target verifies with the
    request's; outputs match PEFT's per adapter, base rows beside them."""
    from lora_adapters import ADAPTERS, peft_greedy, save_adapter

    source, hf = tiny_llama
    name, rank, alpha, targets = ADAPTERS[0]
    path = save_adapter(hf, tmp_path / name, rank, alpha, targets, 0)
    prompts = copy_heavy(source.config.vocab_size, 2, seed=9)
    spec = dict(SPEC, speculative_method=method)
    if method == "draft":
        spec["speculative_draft_model"] = "random:tiny-llama"
    scheduler = make_scheduler(
        "random:tiny-llama", source, lora_modules=[f"{name}={path}"], max_loras=1, **spec
    )
    if method == "draft":  # the draft serves no adapters
        assert scheduler.speculator.proposer.runner.lora is None
    jobs = [(name, prompts[0]), (None, prompts[0]), (name, prompts[1])]
    for i, (adapter, prompt) in enumerate(jobs):
        scheduler.handle_generate_request(
            TokenizedGenerateReqInput(
                rid=f"r{i}", input_ids=prompt, sampling_params=greedy(16), lora_name=adapter
            )
        )
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(len(jobs))}
    while scheduler.has_work():
        scheduler.step()
        for out in scheduler.pop_outputs():
            got[out.rid].extend(out.new_token_ids)
    assert scheduler.get_server_info()["forward_steps_by_mode"]["verify"] > 0
    for i, (adapter, prompt) in enumerate(jobs):
        want = peft_greedy(hf, path if adapter else None, prompt, 16)
        assert got[f"r{i}"] == want, (i, adapter)
