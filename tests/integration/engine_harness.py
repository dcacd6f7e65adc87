"""Helpers for engine-level tests (integration and GPU): run the scheduler in-process and
compare with Hugging Face transformers on the same weights."""

from __future__ import annotations

import random

import torch

from radixserve.boundary import TokenizedGenerateReqInput
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.scheduler.scheduler import Scheduler
from radixserve.scheduler.scheduler_process import build_scheduler
from radixserve.server_args import ServerArgs


def make_scheduler(model: str, source=None, **kwargs) -> Scheduler:
    kwargs.setdefault("device", "cpu")
    kwargs.setdefault("max_total_tokens", 4096)
    return build_scheduler(ServerArgs(model=model, **kwargs), source)


def run_to_completion(
    scheduler: Scheduler,
    prompts: list[list[int]],
    params: SamplingParams | list[SamplingParams],
    max_steps: int = 100_000,
    lora_names: list[str | None] | None = None,
) -> dict[str, dict]:
    """Submit every prompt (under its LoRA adapter, if named), step until idle; returns
    rid -> {"ids", "finish", "cached"}."""
    if isinstance(params, SamplingParams):
        params = [params] * len(prompts)
    names = lora_names or [None] * len(prompts)
    for i, (ids, p, name) in enumerate(zip(prompts, params, names, strict=True)):
        scheduler.handle_generate_request(
            TokenizedGenerateReqInput(rid=f"r{i}", input_ids=ids, sampling_params=p, lora_name=name)
        )
    results: dict[str, dict] = {}
    for _ in range(max_steps):
        if scheduler.waiting_only_in_background():
            scheduler.wait_in_background(timeout=60)
        scheduler.step()
        for out in scheduler.pop_outputs():
            entry = results.setdefault(out.rid, {"ids": [], "finish": None, "cached": 0})
            entry["ids"].extend(out.new_token_ids)
            entry["finish"] = out.finished_reason
            entry["cached"] = out.cached_tokens
        if not scheduler.has_work():
            break
    else:
        raise AssertionError("scheduler did not finish")
    return results


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos: bool = False) -> list[int]:
    """transformers generate, one prompt at a time (no padding), greedy. Without `eos` it runs
    past EOS the way `ignore_eos` does: EOS may be generated, it just does not stop (asking for
    min_new_tokens instead would forbid EOS, which ignore_eos does not)."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
            **({} if eos else {"eos_token_id": None}),
        )
    generated = out[0, len(prompt) :].tolist()
    assert eos or len(generated) == max_new_tokens, "transformers stopped early"
    return generated


def check_against_hf(hf, prompts: list[list[int]], results: dict[str, dict], new_tokens: int):
    """Every request's tokens (rid r0, r1, ... as run_to_completion names them) are what
    transformers generates greedily for its prompt."""
    for i, prompt in enumerate(prompts):
        assert results[f"r{i}"]["ids"] == hf_greedy(hf, prompt, new_tokens), f"request {i} differs"


def random_prompts(n: int, vocab: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def greedy(max_new_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True, **kw)


def token_agreement(a: dict[str, dict], b: dict[str, dict]) -> float:
    """Fraction of tokens that agree before each request's first divergence."""
    same = total = 0
    for rid, entry in a.items():
        x, y = entry["ids"], b[rid]["ids"]
        total += max(len(x), len(y))
        for s, t in zip(x, y, strict=False):
            if s != t:
                break
            same += 1
    return same / total if total else 1.0
