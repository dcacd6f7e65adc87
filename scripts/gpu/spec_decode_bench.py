"""Speculative decoding on the device, in process (scheduler + model worker, no HTTP): the
issue's GPU must-shows, one section per argument, each printing PASS/FAIL lines and writing
its figures to a JSON file.

- `copy MODEL`: a copy-heavy request (rewrite a given text, the answer repeats most of it) at
  batch 1, greedy, with --speculative-method ngram and without: tokens/s of each, the output
  identical, the acceptance length (tokens per verified step). Target: >= 2x.
- `verify MODEL`: device time of a verify step (k proposals, batch 1, proposals always made)
  against a plain decode step on the same request. Target: <= 1.15x at k = 4. Then the sweep
  over batch sizes that sets --speculative-max-batch-size: a verify step's cost per decode step
  at each size (speculation pays while the acceptance length exceeds that cost).
- `draft MODEL --draft DRAFT`: the copy section's request with `--speculative-method draft`
  (DRAFT proposes, same tokenizer): the acceptance length, and the net speed-up that follows
  from it and the step costs, measured.
- `batch MODEL`: 64 requests at once, half copy-heavy, with speculation on (the adaptive switch
  turns it off at this size) and off: on is never slower (>= 0.98x tok/s: run-to-run noise).

Usage: python scripts/gpu/spec_decode_bench.py SECTION MODEL [--json PATH] [--device cuda]
  [--tokens N] [--k K] [--sizes 1,4,8,16,32,64] (CPU dry run: --device cpu, tiny shapes)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from radixserve.boundary import TokenizedGenerateReqInput
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.scheduler.scheduler_process import build_scheduler
from radixserve.server_args import ServerArgs
from radixserve.speculative import speculator as speculator_module

TEXT = (
    "def moving_average(values, window):\n"
    "    if window <= 0:\n"
    "        raise ValueError('window must be positive')\n"
    "    result = []\n"
    "    total = 0.0\n"
    "    for index, value in enumerate(values):\n"
    "        total += value\n"
    "        if index >= window:\n"
    "            total -= values[index - window]\n"
    "        if index + 1 >= window:\n"
    "            result.append(total / window)\n"
    "    return result\n\n\n"
    "def running_maximum(values):\n"
    "    best = None\n"
    "    result = []\n"
    "    for value in values:\n"
    "        best = value if best is None or value > best else best\n"
    "        result.append(best)\n"
    "    return result\n"
)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)


def run(scheduler, prompts, params) -> tuple[dict[str, list[int]], float]:
    """Submit, step until idle; the tokens per request and the wall time."""
    start = time.perf_counter()
    for i, (ids, p) in enumerate(zip(prompts, params, strict=True)):
        scheduler.handle_generate_request(
            TokenizedGenerateReqInput(rid=f"r{i}-{start}", input_ids=ids, sampling_params=p)
        )
    out: dict[str, list[int]] = {}
    while scheduler.has_work():
        scheduler.step()
        for o in scheduler.pop_outputs():
            out.setdefault(o.rid.split("-")[0], []).extend(o.new_token_ids)
    return out, time.perf_counter() - start


def make(model: str, device: str, **kw):
    kw.setdefault("speculative_method", "ngram")
    return build_scheduler(ServerArgs(model=model, device=device, **kw))


def with_speculation(scheduler, on: bool, saved=[]):  # noqa: B006 (the one speculator kept)
    if not saved:
        saved.append(scheduler.speculator)
    scheduler.speculator = saved[0] if on else None


def copy_prompt(scheduler) -> list[int]:
    tok = scheduler.model.tokenizer
    message = "Rewrite this code exactly as it is, with `values` renamed to `xs`:\n\n" + TEXT
    if tok is None:  # random weights: a prompt that repeats itself
        rng = random.Random(0)
        base = [rng.randrange(scheduler.model.vocab_size) for _ in range(64)]
        return base * 4
    ids = tok.apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True
    )
    return ids if isinstance(ids, list) else ids["input_ids"]


def section_copy(a) -> dict:
    kw = {"speculative_num_tokens": a.k}
    if a.section == "draft":
        kw |= {"speculative_method": "draft", "speculative_draft_model": a.draft}
    scheduler = make(a.model, a.device, **kw)
    prompt = copy_prompt(scheduler)
    figures = {}
    for on in (False, True, False, True):  # warm-up, then interleaved
        with_speculation(scheduler, on)
        before = dict(scheduler.get_server_info())
        out, seconds = run(scheduler, [prompt], [greedy(a.tokens)])
        info = scheduler.get_server_info()
        tokens = len(out["r0"])
        row = {"tok_s": tokens / seconds, "tokens": out["r0"]}
        if on:
            verified = (
                info["forward_steps_by_mode"]["verify"] - before["forward_steps_by_mode"]["verify"]
            )
            accepted = info["spec_accepted_tokens"] - before["spec_accepted_tokens"]
            row["verify_steps"] = verified
            row["acceptance_length"] = (accepted + verified) / verified if verified else 0.0
        figures["on" if on else "off"] = row
    off, on = figures["off"], figures["on"]
    speedup = on["tok_s"] / off["tok_s"]
    same = on["tokens"] == off["tokens"]
    target = 2.0 if a.section == "copy" else 1.0
    verdict = "PASS" if speedup >= target and same else "FAIL"
    if a.section == "draft" and a.draft == a.model:
        verdict = "(the target drafting for itself: the draft's cost)" if same else "FAIL"
    print(
        f"{a.section} batch 1: {off['tok_s']:.0f} -> {on['tok_s']:.0f} tok/s (x{speedup:.2f}), "
        f"acceptance length {on['acceptance_length']:.2f} over {on['verify_steps']} verify steps, "
        f"output identical: {same} {verdict}"
    )
    return {
        "speedup": speedup,
        "identical": same,
        **{k: {x: y for x, y in v.items() if x != "tokens"} for k, v in figures.items()},
    }


class AlwaysPropose:
    """Proposes k tokens for every request (to time verify steps; nearly all are rejected)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def propose(self, rids, histories, budgets):
        return [
            [int(h.view()[-1])] * min(self.k, b) for h, b in zip(histories, budgets, strict=True)
        ]

    def on_verified(self, rid, proposed, accepted):
        pass

    def release(self, rid):
        pass


def device_times(scheduler, prompts, n: int) -> list[tuple[str, float]]:
    """(mode, device ms) of every step of a run: decode, verify or other."""
    timeline = scheduler.worker.timeline
    steps: list[tuple[str, float]] = []
    add = timeline.add

    def record(pending, decode):
        if pending.started is not None and pending.done is not None:
            mode = "verify" if pending.verify_draft_lens is not None else "decode"
            steps.append(
                (
                    mode if decode or mode == "verify" else "other",
                    pending.started.elapsed_time(pending.done),
                )
            )
        add(pending, decode)

    timeline.add = record
    scheduler.pop_stats()
    try:
        run(scheduler, prompts, [greedy(n)] * len(prompts))
    finally:
        timeline.add = add
    if not steps:  # the CPU (a dry run): no device events, the steps' wall time
        walls = scheduler.pop_stats().steps
        steps = [(mode, s * 1e3) for mode, _, _, s in walls]
    return steps


def section_verify(a) -> dict:
    speculator_module.LOW_ACCEPTANCE = -1.0  # never turn down: every step verifies
    scheduler = make(a.model, a.device, speculative_num_tokens=a.k, speculative_max_batch_size=512)
    scheduler.speculator.proposer = AlwaysPropose(a.k)
    rng = random.Random(1)
    sizes = [int(s) for s in a.sizes.split(",")]
    result = {}
    for bs in sizes:
        prompts = [
            [rng.randrange(scheduler.model.vocab_size) for _ in range(512)] for _ in range(bs)
        ]
        times = {}
        for on in (False, True, False, True):
            with_speculation(scheduler, on)
            steps = device_times(scheduler, prompts, a.tokens)
            # steady state: the steps of the whole batch after the first few
            kind = [ms for mode, ms in steps[2:] if mode == ("verify" if on else "decode")]
            times[on] = statistics.median(kind) if kind else float("nan")
        ratio = times[True] / times[False]
        result[bs] = {"decode_ms": times[False], "verify_ms": times[True], "ratio": ratio}
        verdict = ("PASS" if ratio <= 1.15 else "FAIL") if bs == 1 else "(sweep)"
        print(
            f"verify k={a.k} batch {bs}: decode {times[False]:.3f} ms, verify {times[True]:.3f} ms "
            f"(x{ratio:.3f}) {verdict}"
        )
    return result


def section_batch(a) -> dict:
    scheduler = make(a.model, a.device, speculative_num_tokens=a.k)
    copy = copy_prompt(scheduler)
    rng = random.Random(2)
    prompts = [
        copy if i % 2 else [rng.randrange(scheduler.model.vocab_size) for _ in range(256)]
        for i in range(64)
    ]
    rates = {}
    for on in (False, True, False, True):
        with_speculation(scheduler, on)
        out, seconds = run(scheduler, prompts, [greedy(a.tokens)] * 64)
        rates[on] = sum(map(len, out.values())) / seconds
    ratio = rates[True] / rates[False]
    print(
        f"batch 64 mixed: off {rates[False]:.0f} tok/s, on {rates[True]:.0f} tok/s (x{ratio:.3f}) "
        f"{'PASS' if ratio >= 0.98 else 'FAIL'}"
    )
    return {"off_tok_s": rates[False], "on_tok_s": rates[True], "ratio": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("section", choices=("copy", "draft", "verify", "batch"))
    parser.add_argument("model")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--draft", help="the draft model (section draft)")
    parser.add_argument("--json")
    a = parser.parse_args()
    sections = {"copy": section_copy, "draft": section_copy}
    result = {**sections, "verify": section_verify, "batch": section_batch}[a.section](a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
