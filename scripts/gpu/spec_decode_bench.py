"""Speculative decoding on the device, in process (scheduler + model worker, no HTTP): the
issue's GPU must-shows, one section per argument, each printing PASS/FAIL lines and writing
its figures to a JSON file.

- `copy MODEL`: a copy-heavy request (rewrite a given text, the answer repeats most of it) at
  batch 1, greedy, with --speculative-method ngram and without: tokens/s of each, the output
  identical, the acceptance length (tokens per verified step), for each k of `--k-sweep`
  (speculation pays more per step the longer the copied runs: one line per k); tokens/s after
  the first token ("decode", what the target is judged on: the prompt's prefill is the same
  work either way) and end to end. The request
  ends where the model's answer ends (its EOS, `--tokens` at most): what follows an answer's
  end is no rewrite of anything (`--ignore-eos` measures past it). Target: the best k >= 2x.
  `--phases`: where the host's time of a step goes (per phase, exclusive, per step), plain and
  at the best k; on the GPU "resolve" holds the wait for the device. `--host-only` (the CPU):
  the forward replays the plain run's answer, so the runs cost the host's work alone.
- `verify MODEL`: device time of a verify step (k proposals, batch 1, proposals always made)
  against a plain decode step on the same request. Target: <= 1.15x at k = 4. Then the sweep
  over batch sizes that sets --speculative-max-batch-size: a verify step's cost per decode step
  at each size (speculation pays while the acceptance length exceeds that cost).
  `--profile`: at batch 1, one more plain run and one verifying, each under the profiler: every
  kernel's device time per step of each, side by side, the largest differences first (where a
  verify step's cost over a decode step goes: its GEMMs at k + 1 rows, the extend attention,
  the acceptance).
- `draft MODEL --draft DRAFT`: the copy section's request with `--speculative-method draft`
  (DRAFT proposes, same tokenizer): the acceptance length, and the net speed-up that follows
  from it and the step costs, measured.
- `batch MODEL`: 64 requests at once, half copy-heavy, with speculation on (the adaptive switch
  turns it off at this size) and off: on is never slower (>= 0.98x tok/s: run-to-run noise).

Usage: python scripts/gpu/spec_decode_bench.py SECTION MODEL [--json PATH] [--device cuda]
  [--tokens N] [--k K] [--k-sweep 4,8,12,16] [--repeats 3] [--ignore-eos] [--phases]
  [--host-only] [--dtype D] [--sizes 1,4,8,16,32,64] (CPU dry run: --device cpu, tiny shapes)
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import random
import statistics
import time

import torch

from radixserve.boundary import TokenizedGenerateReqInput
from radixserve.kernels.argmax import argmax
from radixserve.layers import sampler as sampler_module
from radixserve.model_executor.model_runner import ModelRunner
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.scheduler import schedule_batch, tp_worker
from radixserve.scheduler import scheduler as scheduler_module
from radixserve.scheduler.scheduler_process import build_scheduler
from radixserve.server_args import ServerArgs
from radixserve.speculative import speculator as speculator_module
from radixserve.speculative import verify as verify_module

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


def run(scheduler, prompts, params, first: list | None = None):
    """Submit, step until idle; the tokens per request and the wall time (and in `first`,
    when given, the time to the first token: the requests stream, as a chat client's do)."""
    start = time.perf_counter()
    for i, (ids, p) in enumerate(zip(prompts, params, strict=True)):
        scheduler.handle_generate_request(
            TokenizedGenerateReqInput(
                rid=f"r{i}-{start}", input_ids=ids, sampling_params=p, stream=first is not None
            )
        )
    out: dict[str, list[int]] = {}
    while scheduler.has_work():
        scheduler.step()
        for o in scheduler.pop_outputs():
            out.setdefault(o.rid.split("-")[0], []).extend(o.new_token_ids)
            if first is not None and not first:
                first.append(time.perf_counter() - start)
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


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Where two token lists part (None: identical): a late one in bf16 is a tie the batch
    shape of the verify pass broke the other way, an early one a bug."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def copy_run(scheduler, prompt, params, on: bool) -> dict:
    """One run of the copy request: tok/s, its tokens, and with speculation the verify steps
    and the acceptance length."""
    with_speculation(scheduler, on)
    before = scheduler.get_server_info()
    first: list[float] = []
    out, seconds = run(scheduler, [prompt], [params], first)
    info = scheduler.get_server_info()
    # decode tok/s: the tokens after the first over the time after it (the prompt's prefill,
    # the same work with and without speculation, left out)
    decode_tok_s = (len(out["r0"]) - 1) / (seconds - first[0])
    row = {"tok_s": len(out["r0"]) / seconds, "decode_tok_s": decode_tok_s, "tokens": out["r0"]}
    if on:
        verified = (
            info["forward_steps_by_mode"]["verify"] - before["forward_steps_by_mode"]["verify"]
        )
        accepted = info["spec_accepted_tokens"] - before["spec_accepted_tokens"]
        row["verify_steps"] = verified
        row["acceptance_length"] = (accepted + verified) / verified if verified else 0.0
    return row


def section_copy(a) -> dict:
    ks = [int(k) for k in (a.k_sweep or str(a.k)).split(",")]
    kw = {"speculative_num_tokens": max(ks)}
    if a.dtype:
        kw["dtype"] = a.dtype
    if a.section == "draft":
        kw |= {"speculative_method": "draft", "speculative_draft_model": a.draft}
    scheduler = make(a.model, a.device, **kw)
    speculator = scheduler.speculator
    prompt = copy_prompt(scheduler)
    params = SamplingParams(max_new_tokens=a.tokens, temperature=0.0, ignore_eos=a.ignore_eos)
    answer = copy_run(scheduler, prompt, params, False)["tokens"]  # warm-up, both paths
    if a.host_only:
        replay_answer(scheduler, prompt, answer)
    copy_run(scheduler, prompt, params, True)
    offs: list[dict] = []
    ons: dict[int, list[dict]] = {k: [] for k in ks}
    for _ in range(a.repeats):  # interleaved: drift hits every k alike
        for k in ks:
            offs.append(copy_run(scheduler, prompt, params, False))
            speculator.num_tokens = k  # read per request: the next request proposes up to k
            ons[k].append(copy_run(scheduler, prompt, params, True))
    off_tok_s = statistics.median(r["tok_s"] for r in offs)
    off_decode = statistics.median(r["decode_tok_s"] for r in offs)
    reference = offs[0]["tokens"]
    target = 2.0 if a.section == "copy" else 1.0
    figures: dict[int, dict] = {}
    for k in ks:
        runs = ons[k]
        tok_s = statistics.median(r["tok_s"] for r in runs)
        decode_tok_s = statistics.median(r["decode_tok_s"] for r in runs)
        differs = [first_difference(r["tokens"], reference) for r in runs + offs]
        parted = [d for d in differs if d is not None]
        figures[k] = {
            "tok_s": tok_s,
            "speedup": tok_s / off_tok_s,
            "decode_tok_s": decode_tok_s,
            "decode_speedup": decode_tok_s / off_decode,
            "acceptance_length": statistics.median(r["acceptance_length"] for r in runs),
            "verify_steps": runs[0]["verify_steps"],
            "identical": not parted,
            "first_difference": min(parted) if parted else None,
        }
        f = figures[k]
        same = "True" if f["identical"] else f"False (from token {f['first_difference']})"
        print(
            f"{a.section} batch 1 k={k}: {off_decode:.0f} -> {decode_tok_s:.0f} decode tok/s "
            f"(x{f['decode_speedup']:.2f}; end to end {off_tok_s:.0f} -> {tok_s:.0f}, "
            f"x{f['speedup']:.2f}), acceptance length {f['acceptance_length']:.2f} over "
            f"{f['verify_steps']} verify steps, {len(reference)} tokens, output identical: {same}"
        )
    # judged on decode tok/s: the prompt's prefill is the same work either way, and on a short
    # answer it would hide what speculation does (end to end is printed beside it)
    best = max(ks, key=lambda k: figures[k]["decode_speedup"])
    same = all(f["identical"] for f in figures.values())
    verdict = "PASS" if figures[best]["decode_speedup"] >= target and same else "FAIL"
    if a.host_only:
        verdict = "(host only: the forward replays the answer)"
    if a.section == "draft" and a.draft == a.model:
        verdict = "(the target drafting for itself: the draft's cost)" if same else "FAIL"
    print(
        f"{a.section} batch 1: best k={best} x{figures[best]['decode_speedup']:.2f} decode "
        f"tok/s, x{figures[best]['speedup']:.2f} end to end (target {target:.0f}x), output "
        f"identical for every k: {same} {verdict}"
    )
    result = {
        "off_tok_s": off_tok_s,
        "off_decode_tok_s": off_decode,
        "tokens": len(reference),
        "best_k": best,
        "speedup": figures[best]["speedup"],
        "decode_speedup": figures[best]["decode_speedup"],
        "identical": same,
        "k": figures,
    }
    if a.phases:
        speculator.num_tokens = best
        result["phases"] = {
            label: host_phases(scheduler, prompt, params, on, a.section)
            for label, on in (("off", False), (f"k={best}", True))
        }
    return result


def replay_answer(scheduler, prompt: list[int], answer: list[int]) -> None:
    """`--host-only`: the model's forward becomes the answer it gave, one-hot logits whose
    argmax at every position is the answer's next token there. Greedy verification is exact
    under it (a proposal is kept only if it is the answer's token, so every kept row's input is
    the answer's too), and a step then costs only the host's work: the regime of a tiny model
    on a fast device, without the CPU's forward (which also evicts the host's caches). The
    argmax of those logits is handed over as a replayed graph hands over its in-graph argmax
    (on the CPU it costs ~25 us a row: device work, not the host's). Eager passes only: a
    captured graph keeps the real model. For the rest of the process."""
    model = scheduler.worker.model_runner.model
    following = torch.tensor([*prompt[1:], *answer, 0])  # the token after each position
    vocab = scheduler.model.vocab_size
    last: dict[str, torch.Tensor] = {}

    def forward(input_ids, positions, forward_batch):
        if forward_batch.forward_mode.is_extend():
            ends = forward_batch.extend_start_loc + forward_batch.extend_seq_lens - 1
            positions = positions[ends]
        logits = torch.zeros(len(positions), vocab)
        picks = following[positions.clamp(max=len(following) - 1)]
        logits[torch.arange(len(positions)), picks] = 1.0
        last["logits"], last["picks"] = logits, picks
        return logits

    def replayed_argmax(logits: torch.Tensor) -> torch.Tensor:
        return last["picks"].clone() if logits is last.get("logits") else argmax(logits)

    model.forward = forward
    sampler_module.argmax = verify_module.argmax = replayed_argmax


# The host's phases of a step, (owner, method, label): timed exclusive of the phases they call
# (the model's forward and the device wait are phases of their own).
PHASES = (
    (scheduler_module.Scheduler, "step", "step: the rest"),
    (scheduler_module.Scheduler, "get_next_batch_to_run", "absorb, drop finished, admit"),
    (scheduler_module.Scheduler, "update_running_batch", "update_running_batch: the rest"),
    (speculator_module.Speculator, "plan", "plan: budgets, propose (ngram)"),
    (schedule_batch.ScheduleBatch, "prepare_for_decode", "prepare_for_decode"),
    (schedule_batch.ScheduleBatch, "prepare_for_verify", "prepare_for_verify"),
    (schedule_batch.ScheduleBatch, "get_model_worker_batch", "get_model_worker_batch"),
    (tp_worker.ModelWorker, "launch", "launch: inputs, metadata"),
    (ModelRunner, "forward", "model forward (graph replay or eager)"),
    (tp_worker.ModelWorker, "_verify", "acceptance (verify.py)"),
    (tp_worker.ModelWorker, "_sample", "sampling"),
    (tp_worker.PendingBatchResult, "resolve", "resolve: device wait, to host"),
    (scheduler_module.Scheduler, "_resolve", "_resolve: the rest"),
    (scheduler_module.Scheduler, "_append_verified", "append verified, settle, free KV"),
    (scheduler_module.Scheduler, "_append_token", "append token"),
    (scheduler_module.Scheduler, "_emit", "emit outputs"),
)


def host_phases(scheduler, prompt, params, on: bool, section: str) -> dict[str, float]:
    """One run with every phase timed: microseconds per step of each, exclusive, printed as a
    table (the wrappers add about a microsecond a call)."""
    spent: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter[str] = collections.Counter()
    inner: list[float] = []  # per open phase: the time its nested phases took

    def timed(method, label):
        @functools.wraps(method)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            inner.append(0.0)
            try:
                return method(*args, **kwargs)
            finally:
                took = time.perf_counter() - start
                spent[label] += took - inner.pop()
                calls[label] += 1
                if inner:
                    inner[-1] += took

        return wrapper

    originals = [(owner, name, owner.__dict__[name]) for owner, name, _ in PHASES]
    for (owner, name, method), (_, _, label) in zip(originals, PHASES, strict=True):
        setattr(owner, name, timed(method, label))
    try:
        row = copy_run(scheduler, prompt, params, on)
    finally:
        for owner, name, method in originals:
            setattr(owner, name, method)
    steps = calls["step: the rest"]
    per_step = {label: spent[label] * 1e6 / steps for _, _, label in PHASES if calls[label]}
    host = sum(us for label, us in per_step.items() if not label.startswith(("model", "resolve")))
    mode = "speculation k=" + str(scheduler.speculator.num_tokens) if on else "plain decode"
    print(f"{section} phases, {mode}: {steps} steps, {len(row['tokens'])} tokens, us per step:")
    for label, us in sorted(per_step.items(), key=lambda item: -item[1]):
        print(f"{section} phases   {label:40s} {us:9.1f}  ({calls[label]} calls)")
    print(
        f"{section} phases   host, but the forward and the device wait: {host:.1f} us per step, "
        f"{host * steps / len(row['tokens']):.1f} us per token"
    )
    return per_step


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

    def record(pending, mode, tokens=0):
        if pending.started is not None and pending.done is not None:
            kind = "verify" if pending.verify_draft_lens is not None else "decode"
            steps.append(
                (
                    kind if mode == "decode" or kind == "verify" else "other",
                    pending.started.elapsed_time(pending.done),
                )
            )
        add(pending, mode, tokens)

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
        if a.profile and bs == 1:
            result["profile"] = profile_steps(scheduler, prompts, a.tokens)
        verdict = ("PASS" if ratio <= 1.15 else "FAIL") if bs == 1 else "(sweep)"
        print(
            f"verify k={a.k} batch {bs}: decode {times[False]:.3f} ms, verify {times[True]:.3f} ms "
            f"(x{ratio:.3f}) {verdict}"
        )
    return result


def profile_steps(scheduler, prompts, n: int) -> list[dict]:
    """Each kernel's device time per step in a plain run and in a verifying one (the prompt's
    prefill amortized over the run's steps: one pass of n), printed largest difference first.
    Kernels launched as programmatic dependents count their wait on the kernel before them, so
    the per-kernel sums overstate (the step times above do not)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()  # the CPU's dry run: its operators' own time
    per_step = {}
    for on in (False, True):
        with_speculation(scheduler, on)
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            steps = device_times(scheduler, prompts, n)
            if cuda:
                torch.cuda.synchronize()
        count = sum(1 for mode, _ in steps if mode == ("verify" if on else "decode"))
        totals = collections.Counter()
        for event in prof.key_averages():
            us = event.self_device_time_total if cuda else event.self_cpu_time_total
            if us > 0:
                totals[event.key[:70]] += us / max(count, 1)
        per_step[on] = totals
    rows = [
        {"kernel": name, "decode_us": per_step[False][name], "verify_us": per_step[True][name]}
        for name in per_step[False].keys() | per_step[True].keys()
    ]
    rows.sort(key=lambda r: -abs(r["verify_us"] - r["decode_us"]))
    print(f"{'kernel (us a step)':70} {'decode':>9} {'verify':>9} {'diff':>9}")
    for r in rows[:40]:
        diff = r["verify_us"] - r["decode_us"]
        print(f"{r['kernel']:70} {r['decode_us']:9.1f} {r['verify_us']:9.1f} {diff:9.1f}")
    print(
        f"{'all kernels':70} {sum(per_step[False].values()):9.1f} {sum(per_step[True].values()):9.1f}"
    )
    return rows


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
    parser.add_argument("--k-sweep", help="copy/draft: the k to measure, e.g. 4,8,12,16")
    parser.add_argument("--repeats", type=int, default=3, help="copy/draft: runs of each k")
    parser.add_argument("--ignore-eos", action="store_true", help="copy: past the answer's end")
    parser.add_argument("--phases", action="store_true", help="copy: the host's time per phase")
    parser.add_argument("--dtype", help="the model's dtype (default: the server's)")
    parser.add_argument(
        "--host-only", action="store_true", help="copy, CPU: the forward replays the answer"
    )
    parser.add_argument("--sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--profile", action="store_true", help="verify: kernels per step")
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
