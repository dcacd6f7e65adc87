"""Where the device waits in an offline run: the scheduler in process on `bench offline`'s
workload (`make_workload`: prompts of 256-1024 random tokens, 64-256 out, all submitted at
once), each step's host time split into forming the next batch, launching it and resolving the
one before, beside the gap the device saw before each batch (the GPU timeline's events).

It prints, by forward mode, the batches with a gap over 2 ms and what their steps' host times
were, which batch came before them, and a few examples; with PROF=1, a cProfile of the run
(sorted by own time: the launches' host costs). Writes every step to $OUT/steps.json.

Usage (device tool): python3 scripts/gpu/offline_steps.py MODEL REQUESTS DEVICE [MIN_ADMISSION]
e.g. `python3 scripts/gpu/offline_steps.py random:llama-3-8b 1000 cuda`
(CPU: `random:tiny-llama 60 cpu`, which checks the plumbing; its gaps are zero; MAXRUN=256
sets --max-running-requests, the CUDA default, so the CPU's scheduler forms the H200's batches).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import json
import os
import pstats
import statistics
import sys
import time

from radixserve.bench.offline import make_workload
from radixserve.boundary import TokenizedGenerateReqInput
from radixserve.model_loader.loader import load_model_source
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.scheduler.scheduler_process import build_scheduler
from radixserve.server_args import ServerArgs

model, requests, device = sys.argv[1], int(sys.argv[2]), sys.argv[3]
min_admission = int(sys.argv[4]) if len(sys.argv) > 4 else ServerArgs.min_admission_batch
source = load_model_source(model, dtype="auto", device=device, context_length=4096)
args = ServerArgs(
    model=model,
    device=device,
    context_length=4096,
    attention_backend="triton" if device == "cuda" else "torch_native",
    min_admission_batch=min_admission,
    max_running_requests=int(os.environ.get("MAXRUN", "0")) or None,
)
scheduler = build_scheduler(args, source)
print(f"max running {scheduler.max_running_requests}, KV {scheduler.worker.max_total_tokens}")


def submit(n: int, tag: str, seed: int) -> None:
    """n requests of `bench offline`'s workload (its default seed is 1)."""
    lengths = argparse.Namespace(
        bench_seed=seed, num_prompts=n, input_len=1024, input_len_min=256, output_len=256,
        output_len_min=64,
    )  # fmt: skip
    work = make_workload(lengths, scheduler.model.vocab_size)
    for i, (ids, out) in enumerate(zip(work.prompts, work.output_lens, strict=True)):
        params = SamplingParams(max_new_tokens=out, temperature=0.0, ignore_eos=True)
        scheduler.dispatch(TokenizedGenerateReqInput(f"{tag}{i}", ids, params))


def run() -> None:
    while scheduler.has_work():
        scheduler.step()
        scheduler.pop_outputs()


submit(8, "warm", seed=0)  # kernels compiled, graphs captured: the run times steady work
run()

steps: list[dict] = []  # per launched batch: mode, requests, host ms of its step's phases
gaps: list[float] = []  # per batch in launch order: the device's gap before it (ms)
timeline = scheduler.worker.timeline
add, form, launch, resolve = (
    timeline.add,
    scheduler.get_next_batch_to_run,
    scheduler._launch,
    scheduler._resolve,
)
formed_ms = [0.0]


def timed_add(pending, mode, tokens=0):
    before = timeline.gap_ms
    add(pending, mode, tokens)
    gaps.append(timeline.gap_ms - before)


def timed_form():
    start = time.perf_counter()
    batch = form()
    formed_ms[0] = (time.perf_counter() - start) * 1e3
    return batch


def timed_launch(batch):
    start = time.perf_counter()
    launched = launch(batch)
    steps.append(
        {
            "mode": batch.forward_mode.metric_label,
            "requests": len(batch.reqs),
            "tokens": int(batch.input_ids.numel()),
            "form_ms": formed_ms[0],
            "launch_ms": (time.perf_counter() - start) * 1e3,
        }
    )
    return launched


def timed_resolve(launched, masked=None):
    start = time.perf_counter()
    launched.pending.resolve()  # the wait for the device, then the host's own work
    waited = time.perf_counter() - start
    resolve(launched, masked)
    steps[-1]["resolve_before_ms"] = (time.perf_counter() - start) * 1e3
    steps[-1]["resolve_wait_ms"] = waited * 1e3


timeline.add = timed_add
scheduler.get_next_batch_to_run = timed_form
scheduler._launch = timed_launch
scheduler._resolve = timed_resolve

submit(requests, "r", seed=1)
profiler = cProfile.Profile()
if os.environ.get("PROF"):
    profiler.enable()
start = time.perf_counter()
run()
profiler.disable()
print(f"wall {time.perf_counter() - start:.2f} s, {len(steps)} batches")
for step, gap in zip(steps, gaps, strict=True):
    step["gap_ms"] = gap


def summary(rows: list[dict], key: str) -> str:
    values = [r[key] for r in rows if key in r]
    if not values:
        return f"{key} -"
    return (
        f"{key} mean {statistics.mean(values):.2f} p50 {statistics.median(values):.2f} "
        f"max {max(values):.2f}"
    )


for mode in sorted({s["mode"] for s in steps}):
    rows = [s for s in steps if s["mode"] == mode]
    long = [s for s in rows if s["gap_ms"] > 2]
    print(
        f"{mode}: {len(rows)} batches, {len(long)} with a gap over 2 ms; "
        + "; ".join(summary(rows, k) for k in ("gap_ms", "form_ms", "launch_ms", "tokens"))
    )
    print(
        "  those over 2 ms: "
        + "; ".join(summary(long, k) for k in ("form_ms", "launch_ms", "requests", "tokens"))
    )
    before = collections.Counter(
        steps[i - 1]["mode"] for i, s in enumerate(steps) if i and s in long
    )
    print(f"  the batch before them: {dict(before)}")
for i, step in enumerate(steps):
    if i and step["gap_ms"] > 8:
        shown = {k: round(v, 2) if isinstance(v, float) else v for k, v in step.items()}
        print(f"  e.g. #{i} {json.dumps(shown)}")
        if sum(1 for s in steps[: i + 1] if s["gap_ms"] > 8) >= 6:
            break
with open(os.path.join(os.environ.get("OUT", "/tmp"), "steps.json"), "w") as f:
    json.dump(steps, f)
if os.environ.get("PROF"):
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
