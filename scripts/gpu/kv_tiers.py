"""The host KV tier on a multi-turn workload whose working set is ~4x the GPU pool.

One server per configuration (tier off, then `--kv-host-memory` with each write policy), each
driven by `radixserve bench serving --turns` (sessions of TURNS turns: the first prompt
INPUT_LEN tokens, each later turn the whole conversation plus TURN_LEN new tokens), its
/metrics read before it stops. Reported against the tier off: output throughput and TTFT p50
(the issue: >= 1.8x and >= 2x lower), decode ITL p50 (requests that restore nothing should not
step slower), and the restore bandwidth (host bytes restored / summed restore time) against the
pinned host-to-device copy rate measured here first. Usage: python3 scripts/gpu/kv_tiers.py OUT
(environment: PRESET, VOCAB_RANGE, SESSIONS, CONCURRENCY, TURNS, INPUT_LEN, TURN_LEN, OUTPUT_LEN,
POOL, HOST_GB, POLICIES, SERVE_ARGS). A CPU dry run: PRESET=tiny-llama with small numbers.

The pool holds the requests in flight (CONCURRENCY at a time, 8 of 2k tokens) several times
over, while the sessions between their turns (SESSIONS, 64: each turn queues behind the other
sessions' turns) hold ~4x the pool: the shape where a tier pays. A pool too small for the
requests in flight (the first version: 24 sessions all in flight on a 12,800-token pool) bounds
both runs by how few requests decode at once, not by prefill, and the tier cannot show.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from radixserve.bench import serving
from radixserve.bench.server_process import ServerProcess


def env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def h2d_bandwidth() -> float | None:
    """Pinned host-to-device copy rate (bytes/s) of 1 GiB, the best of three."""
    if not torch.cuda.is_available():
        return None
    host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    device = torch.empty_like(host, device="cuda")
    best = 0.0
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        device.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        best = max(best, host.numel() / (time.perf_counter() - start))
    del host, device
    return best


def metric_sum(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for match in re.finditer(rf"^{name}(?:\{{([^}}]*)\}})? (\S+)$", text, re.MULTILINE):
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if labels.items() <= found.items():
            total += float(match.group(2))
    return total


def bench_args(base_url: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serving.add_args(parser)
    return parser.parse_args(
        [
            "--base-url", base_url,
            "--num-requests", env("SESSIONS", "64"),
            "--turns", env("TURNS", "8"),
            "--turn-len", env("TURN_LEN", "128"),
            "--input-len", env("INPUT_LEN", "1024"),
            "--output-len", env("OUTPUT_LEN", "32"),
            "--max-concurrency", env("CONCURRENCY", "8"),
            "--vocab-range", env("VOCAB_RANGE", "32000"),
        ]
    )  # fmt: skip


def run_config(name: str, extra: list[str], out: Path) -> dict:
    model = f"random:{env('PRESET', 'llama-3-8b')}"
    args = ["--model", model, "--context-length", "4096"]
    args += ["--max-total-tokens", env("POOL", "32768")]
    args += env("SERVE_ARGS", "").split() + extra
    print(f"=== {name}: radixserve serve {' '.join(args)} ({time.strftime('%T')})", flush=True)
    with ServerProcess(args, out / f"server-{name}.log") as server:
        report = asyncio.run(serving.run_benchmark(bench_args(server.base_url), server.base_url))
        _, body = server.get("/metrics")
    text = body.decode()
    restored = metric_sum(text, "radixserve_kv_tier_bytes_total", tier="host", op="restored")
    restore_s = metric_sum(text, "radixserve_kv_restore_seconds_sum")
    restores = metric_sum(text, "radixserve_kv_restore_seconds_count")
    hits = {
        tier: metric_sum(text, "radixserve_prefix_cache_hits_tokens_total", tier=tier)
        for tier in ("gpu", "host", "disk")
    }
    row = {
        "config": name,
        "completed": report.completed,
        "failed": report.failed,
        "output_tok_s": report.output_token_throughput,
        "request_s": report.request_throughput,
        "ttft_p50_ms": report.ttft_ms["p50"],
        "ttft_p99_ms": report.ttft_ms["p99"],
        "gpu_busy": report.gpu_busy,
        "itl_p50_ms": report.itl_ms["p50"],
        "cached_prompt_tokens": report.cached_prompt_tokens,
        "hits_by_tier": hits,
        "restored_bytes": restored,
        "restore_seconds": restore_s,
        "restores": restores,
        "report": asdict(report),
    }
    busy = f"{report.gpu_busy:.1%}" if report.gpu_busy is not None else "n/a"
    print(
        f"{name}: {report.completed}/{report.num_requests} done, {row['output_tok_s']:.0f} out"
        f" tok/s, TTFT p50 {row['ttft_p50_ms']:.1f} ms (p99 {row['ttft_p99_ms']:.1f}), ITL p50"
        f" {row['itl_p50_ms']:.2f} ms, GPU busy {busy}, hits {hits}, restored"
        f" {restored / 1e9:.2f} GB in {restore_s:.2f} s ({restores:.0f} restores: one per"
        " admission round that restored)",
        flush=True,
    )
    return row


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    bandwidth = h2d_bandwidth()
    if bandwidth:
        print(f"pinned host-to-device copy: {bandwidth / 1e9:.1f} GB/s", flush=True)
    rows = [run_config("off", [], out)]
    host = ["--kv-host-memory", env("HOST_GB", "16")]
    for policy in env("POLICIES", "write_back write_through").split():
        rows.append(run_config(policy, [*host, "--kv-write-policy", policy], out))
    (out / "kv-tiers.json").write_text(
        json.dumps({"h2d_bytes_per_s": bandwidth, "runs": rows}, indent=2) + "\n"
    )
    base = rows[0]
    ok = all(row["failed"] == 0 for row in rows)
    for row in rows[1:]:
        speedup = row["output_tok_s"] / max(base["output_tok_s"], 1e-9)
        ttft = base["ttft_p50_ms"] / max(row["ttft_p50_ms"], 1e-9)
        itl = row["itl_p50_ms"] / max(base["itl_p50_ms"], 1e-9)
        verdict = "PASS" if speedup >= 1.8 and ttft >= 2.0 else "FAIL"
        ok = ok and verdict == "PASS"
        print(
            f"{row['config']}: throughput x{speedup:.2f} (>= 1.8), TTFT p50 {ttft:.2f}x lower"
            f" (>= 2), ITL p50 x{itl:.3f} of tier off {verdict}"
        )
        if row["restore_seconds"] > 0:
            rate = row["restored_bytes"] / row["restore_seconds"]
            share = f", {rate / bandwidth:.0%} of the pinned copy rate" if bandwidth else ""
            print(f"{row['config']}: restore bandwidth {rate / 1e9:.1f} GB/s{share}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
