"""`radixserve bench offline`: N requests through the in-process Engine, all submitted at once,
next to Hugging Face transformers `generate` on the same weights and prompts in the same run.

Prompts are random token ids (lengths uniform in [input-len-min, input-len]) and every request
generates exactly its output length (ignore_eos), so both sides do the same work. transformers
runs either one request at a time (`sequential`, what a naive server does) or in padded batches
(`batched`, its best case); both can be asked for. On CUDA the run also measures the device's
bf16 matmul rate and reports throughput as a fraction of it (FLOPs per token ~ 2 x parameters).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from radixserve.contract import HTTP_ONLY_FIELDS, add_server_args, server_args_from
from radixserve.server_args import ServerArgs
from radixserve.utils import resolve_device


@dataclass
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def input_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)


@dataclass
class Result:
    name: str
    seconds: float
    requests: int
    input_tokens: int
    output_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def total_tok_s(self) -> float:
        return (self.input_tokens + self.output_tokens) / self.seconds


def add_args(parser: argparse.ArgumentParser) -> None:
    engine = parser.add_argument_group(
        "engine", "the in-process engine's flags (`radixserve serve`'s, less the HTTP server's)"
    )
    add_server_args(engine, exclude=HTTP_ONLY_FIELDS)
    parser = parser.add_argument_group("benchmark")
    parser.add_argument(
        "--num-prompts", type=int, default=32, help="requests, all submitted at once (default: 32)"
    )
    parser.add_argument(
        "--input-len", type=int, default=128, help="longest prompt, in tokens (default: 128)"
    )
    parser.add_argument(
        "--input-len-min", type=int, default=None, help="shortest prompt (default: input-len)"
    )
    parser.add_argument(
        "--output-len", type=int, default=64, help="longest output, in tokens (default: 64)"
    )
    parser.add_argument(
        "--output-len-min", type=int, default=None, help="shortest output (default: output-len)"
    )
    parser.add_argument(
        "--transformers",
        default="sequential",
        help="comma list of sequential, batched, none: the transformers baselines to run "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--hf-batch-size", type=int, default=32, help="batch of the batched baseline (default: 32)"
    )
    parser.add_argument(
        "--hf-max-prompts",
        type=int,
        default=None,
        help="run transformers on the first N prompts only (it is slow)",
    )
    parser.add_argument(
        "--bench-seed", type=int, default=1, help="seed of the prompts and their lengths"
    )
    parser.add_argument("--output-json", default=None, help="also write the results to this file")


_START = time.perf_counter()


def progress(message: str) -> None:
    """One line per phase on stderr (stdout keeps the results), with the time since start."""
    print(f"[bench {time.perf_counter() - _START:6.1f}s] {message}", file=sys.stderr, flush=True)


def legend(results: list[Result], work: Workload) -> list[str]:
    """What each column of the results table means, and each system row."""
    lines = [
        "system       what ran (see below); each generates the same number of tokens for the "
        "same prompts on the same weights",
        "seconds      wall time of the timed run (start-up and warm-up excluded)",
        "req/s        requests finished per second",
        "out tok/s    generated tokens per second, all requests together",
        "total tok/s  prompt plus generated tokens per second",
        "vs ours      this row's out tok/s divided by radixserve's: 1.000 is radixserve, 0.250 "
        "is four times slower",
    ]
    for r in results:
        if r.name == "radixserve":
            what = f"this engine in process, all {r.requests} requests submitted at once"
        elif r.name.endswith("sequential"):
            what = f"transformers `generate`, one request at a time ({r.extra.get('device')})"
        else:
            what = (
                f"transformers `generate`, left-padded batches of {r.extra.get('batch_size')} "
                f"({r.extra.get('device')})"
            )
        if r.requests < len(work.prompts):
            what += f", on the first {r.requests} prompts only (--hf-max-prompts)"
        lines.append(f"  {r.name:<24} {what}")
    return lines


def make_workload(args: argparse.Namespace, vocab_size: int) -> Workload:
    rng = random.Random(args.bench_seed)
    lo_in = args.input_len_min or args.input_len
    lo_out = args.output_len_min or args.output_len
    prompts = [
        [rng.randrange(10, vocab_size) for _ in range(rng.randint(lo_in, args.input_len))]
        for _ in range(args.num_prompts)
    ]
    return Workload(prompts, [rng.randint(lo_out, args.output_len) for _ in prompts])


def run_engine(server_args: ServerArgs, work: Workload) -> Result:
    from radixserve.frontend.engine import Engine

    progress("radixserve: starting the engine (scheduler process, model load, KV pool)...")
    with Engine(server_args) as engine:
        # warm-up: first-call allocations, CUDA graph capture already done at start
        progress("radixserve: warm-up request...")
        engine.generate(input_ids=work.prompts[0][:8], sampling_params={"max_new_tokens": 4})
        engine.flush_cache()
        params = [
            {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True} for n in work.output_lens
        ]
        before = engine.get_server_info()
        progress(
            f"radixserve: running {len(work.prompts)} prompts ({work.input_tokens} input, "
            f"{work.output_tokens} output tokens)..."
        )
        start = time.perf_counter()
        outs = engine.generate(input_ids=work.prompts, sampling_params=params)
        seconds = time.perf_counter() - start
        info = engine.get_server_info()
    progress(f"radixserve: done in {seconds:.1f} s")

    def idle_share(busy_key: str, gap_key: str) -> float | None:
        busy = info.get(busy_key, 0.0) - before.get(busy_key, 0.0)
        gap = info.get(gap_key, 0.0) - before.get(gap_key, 0.0)
        return gap / (busy + gap) if busy + gap else None

    def by_mode() -> dict[str, dict[str, float]]:
        """Each forward mode's device time, the gaps before its batches and its tokens, over
        this run (the GPU records them; the CPU records nothing)."""
        modes: dict[str, Any] = {}
        for key, name in (
            ("gpu_busy_ms_by_mode", "busy_ms"),
            ("gpu_gap_ms_before_mode", "gap_before_ms"),
            ("gpu_tokens_by_mode", "tokens"),
            ("gpu_gap_count_before_mode", "gaps"),
        ):
            old = before.get(key, {})
            for mode, value in info.get(key, {}).items():
                modes.setdefault(mode, {})[name] = value - old.get(mode, 0)
        old_longest = before.get("gpu_longest_gaps_ms_before_mode", {})
        for mode, gaps in info.get("gpu_longest_gaps_ms_before_mode", {}).items():
            modes.setdefault(mode, {})["longest_gaps_ms"] = gaps_since(
                old_longest.get(mode, []), gaps
            )
        return modes

    def garbage_collections() -> dict[str, Any]:
        """The scheduler process's garbage collections during the run: how many and their
        milliseconds per generation, and the longest since start-up (gc_pauses.py)."""
        return {
            key: {
                gen: value - before.get(key, {}).get(gen, 0)
                for gen, value in info.get(key, {}).items()
            }
            for key in ("gc_collections", "gc_pause_ms")
        } | {"gc_longest_pause_ms": info.get("gc_longest_pause_ms", {})}

    produced = sum(o["meta_info"]["completion_tokens"] for o in outs)
    assert produced == work.output_tokens, (produced, work.output_tokens)
    return Result(
        "radixserve",
        seconds,
        len(outs),
        work.input_tokens,
        produced,
        {
            "attention_backend": info.get("attention_backend"),
            "max_total_tokens": info.get("max_total_tokens"),
            "retractions": info.get("num_retractions"),
            "overlap": info.get("overlap"),
            "gpu_idle_between_batches": idle_share("gpu_busy_ms", "gpu_gap_ms"),
            "gpu_idle_between_decode_steps": idle_share("gpu_decode_busy_ms", "gpu_decode_gap_ms"),
            "gpu_by_mode": by_mode(),
            "scheduler_gc": garbage_collections(),
        },
    )


def gaps_since(before: list[float], after: list[float]) -> list[float]:
    """The longest gaps of a run: those of the server's list after it (`after`) that its list
    before it (the warm-up's few short decode gaps) did not hold already."""
    earlier = list(before)
    run = []
    for gap in after:
        if gap in earlier:
            earlier.remove(gap)
        else:
            run.append(gap)
    return run


def breakdown(modes: dict[str, dict[str, Any]], params: int, peak: float | None) -> dict[str, Any]:
    """Where the device's time went by forward mode: each mode's share of the run's device
    span (busy and the gaps before its batches), its tokens, and its own MFU (2 x params FLOPs
    a token over its busy time, against the measured bf16 matmul rate; attention left out);
    how many gaps came before its batches and the longest of them (a few long gaps are a
    stall, many short ones host work the overlap did not hide)."""
    span = sum(m.get("busy_ms", 0.0) + m.get("gap_before_ms", 0.0) for m in modes.values())
    out: dict[str, Any] = {}
    for mode, m in sorted(modes.items()):
        busy, gap, tokens = m.get("busy_ms", 0.0), m.get("gap_before_ms", 0.0), m.get("tokens", 0)
        row = {
            "busy_share": busy / span if span else 0.0,
            "gap_before_share": gap / span if span else 0.0,
            "tokens": tokens,
            "busy_ms": busy,
            "gaps": m.get("gaps", 0),
            "longest_gaps_ms": [round(g, 2) for g in m.get("longest_gaps_ms", [])],
        }
        if peak and busy:
            row["mfu"] = tokens * 2 * params / (busy / 1e3) / 1e12 / peak
        out[mode] = row
    return out


def breakdown_lines(rows: dict[str, Any]) -> list[str]:
    """The by-mode breakdown as a table."""
    lines = [
        f"{'mode':<10}{'device time':>13}{'idle before':>13}{'tokens':>12}{'MFU':>8}"
        f"{'gaps':>8}  longest gaps (ms)"
    ]
    for mode, row in rows.items():
        mfu = f"{100 * row['mfu']:.1f}%" if "mfu" in row else "—"
        longest = ", ".join(f"{g:.1f}" for g in row.get("longest_gaps_ms", [])) or "—"
        lines.append(
            f"{mode:<10}{100 * row['busy_share']:>12.1f}%{100 * row['gap_before_share']:>12.2f}%"
            f"{int(row['tokens']):>12}{mfu:>8}{int(row.get('gaps', 0)):>8}  {longest}"
        )
    return lines


def run_transformers(
    source: Any, work: Workload, mode: str, batch_size: int, limit: int | None
) -> Result:
    import torch

    from radixserve.model_loader.loader import build_hf_reference

    device = "cuda" if torch.cuda.is_available() and source.config.dtype != torch.float32 else "cpu"
    progress(f"transformers-{mode}: building the reference model on {device}...")
    model = build_hf_reference(source, dtype=source.config.dtype).to(device)
    n = min(limit or len(work.prompts), len(work.prompts))
    prompts, lens = work.prompts[:n], work.output_lens[:n]
    groups = (
        [[i] for i in range(n)]
        if mode == "sequential"
        else [list(range(i, min(i + batch_size, n))) for i in range(0, n, batch_size)]
    )

    def generate(idx: list[int]) -> None:
        width = max(len(prompts[i]) for i in idx)
        ids = torch.zeros(len(idx), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(idx):  # left padding, as decoder-only generation needs
            ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]) :] = 1
        new = max(lens[i] for i in idx)
        with torch.no_grad():
            model.generate(
                ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )

    progress(f"transformers-{mode}: warm-up...")
    generate(groups[0][:1])  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    progress(
        f"transformers-{mode}: running {n} prompts in {len(groups)} "
        f"{'call' if len(groups) == 1 else 'calls'} of `generate` (the slow part)..."
    )
    start = time.perf_counter()
    every = max(1, len(groups) // 8)  # at most about eight progress lines
    for done, idx in enumerate(groups, 1):
        generate(idx)
        if done % every == 0 and done < len(groups):
            progress(f"transformers-{mode}: {done}/{len(groups)} calls done")
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    progress(f"transformers-{mode}: done in {seconds:.1f} s")
    # a batch generates as many tokens as its longest member asks for; count only what was asked
    return Result(
        f"transformers-{mode}",
        seconds,
        n,
        sum(len(p) for p in prompts),
        sum(lens),
        {"batch_size": 1 if mode == "sequential" else batch_size, "device": device},
    )


def measure_matmul_tflops() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * n**3 * 20 / (start.elapsed_time(end) / 1e3) / 1e12


def run(args: argparse.Namespace) -> int:
    from radixserve.model_loader.loader import load_model_source_for

    server_args = server_args_from(args)
    progress(f"loading {server_args.model} (converted once, then read from the cache)...")
    source = load_model_source_for(server_args)
    work = make_workload(args, source.config.vocab_size)
    # every prompt is submitted at once: the queue bound (an HTTP server's guard) must hold them
    server_args.max_queued_requests = max(server_args.max_queued_requests, len(work.prompts))
    results = [run_engine(server_args, work)]
    for mode in [m.strip() for m in args.transformers.split(",") if m.strip() not in ("", "none")]:
        results.append(
            run_transformers(source, work, mode, args.hf_batch_size, args.hf_max_prompts)
        )
    params = source.config.matmul_parameters
    peak = measure_matmul_tflops()
    if peak is not None:
        progress(f"measured the GPU's bf16 matmul rate: {peak:.0f} TFLOP/s")

    print(
        f"\nmodel {server_args.model} ({params / 1e6:.0f}M params), {len(work.prompts)} requests, "
        f"{work.input_tokens} input / {work.output_tokens} output tokens, device "
        f"{resolve_device(server_args.device)}"
    )
    print(
        f"{'system':<26}{'seconds':>9}{'req/s':>8}{'out tok/s':>11}{'total tok/s':>13}{'vs ours':>9}"
    )
    ours = results[0].output_tok_s
    for r in results:
        print(
            f"{r.name:<26}{r.seconds:>9.2f}{r.requests / r.seconds:>8.2f}{r.output_tok_s:>11.1f}"
            f"{r.total_tok_s:>13.1f}{r.output_tok_s / ours:>9.3f}"
        )
    print("\n".join(["", *legend(results, work), ""]))
    summary: dict[str, Any] = {
        "model": server_args.model,
        "params": params,
        "results": [
            asdict(r) | {"output_tok_s": r.output_tok_s, "total_tok_s": r.total_tok_s}
            for r in results
        ],
    }
    for r in results[1:]:
        print(f"radixserve / {r.name}: {ours / r.output_tok_s:.2f}x output tokens/s")
    idle = results[0].extra.get("gpu_idle_between_batches")
    if idle is not None:
        print(
            f"GPU idle between batches: {100 * idle:.2f}% of the batches' span "
            f"(overlap {'on' if results[0].extra.get('overlap') else 'off'})"
        )
    decode_idle = results[0].extra.get("gpu_idle_between_decode_steps")
    if decode_idle is not None:
        print(f"GPU idle between consecutive decode steps: {100 * decode_idle:.2f}%")
    gc_run = results[0].extra.get("scheduler_gc")
    if gc_run and gc_run["gc_collections"]:
        counts, pauses = gc_run["gc_collections"], gc_run["gc_pause_ms"]
        print(
            f"scheduler process garbage collections during the run: {sum(counts.values())} "
            f"({counts.get('2', 0)} full), {sum(pauses.values()):.1f} ms in all, the longest "
            f"{max(gc_run['gc_longest_pause_ms'].values(), default=0.0):.1f} ms"
        )
    if peak is not None:
        achieved = results[0].total_tok_s * 2 * params / 1e12
        summary |= {"bf16_matmul_tflops": peak, "achieved_tflops": achieved}
        print(
            f"compute: {achieved:.1f} TFLOP/s of a measured {peak:.0f} bf16 TFLOP/s "
            f"({100 * achieved / peak:.1f}% MFU, 2 x params FLOPs per token)"
        )
    modes = results[0].extra.get("gpu_by_mode") or {}
    if modes:
        summary["gpu_by_mode"] = breakdown(modes, params, peak)
        print("\n".join(["", *breakdown_lines(summary["gpu_by_mode"])]))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0
