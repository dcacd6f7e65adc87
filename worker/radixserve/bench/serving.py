"""`radixserve bench serving`: load a running server the way clients would and measure it.

N requests arrive as a Poisson process at `--request-rate` (or all at once), optionally capped
at `--max-concurrency` in flight. Prompts are random token ids (every model, tokenizer or not,
can serve them), optionally behind a shared prefix so the radix cache has something to hit,
and outputs have a fixed length (`ignore_eos`). Requests stream through the native `/generate`
endpoint, whose chunks carry token ids, so time to first token, inter-token latency and
end-to-end latency are measured per token, not per decoded text fragment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

from radixserve.bench.offline import measure_matmul_tflops
from radixserve.bench.server_process import ServerProcess


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itls: list[float] = field(default_factory=list)
    error: str = ""


@dataclass
class Report:
    num_requests: int
    completed: int
    failed: int
    duration_s: float
    request_throughput: float
    input_token_throughput: float
    output_token_throughput: float
    ttft_ms: dict[str, float]
    itl_ms: dict[str, float]
    e2e_ms: dict[str, float]
    cached_prompt_tokens: int
    # 2 x matmul parameters per computed token (prompt tokens not served from the cache, plus
    # generated ones), over the run; the ceiling is a bf16 matmul measured on this machine's
    # GPU when there is one and the server runs on CUDA (a server elsewhere: compare by hand)
    achieved_tflops: float
    matmul_tflops: float | None
    mfu: float | None
    gpu_busy: float | None  # share of the run the server's GPU spent inside batches
    settings: dict

    def lines(self) -> list[str]:
        def stats(name: str, values: dict[str, float]) -> str:
            return f"{name:<22} " + "  ".join(f"{k} {v:9.1f}" for k, v in values.items())

        return [
            f"{'completed / failed':<22} {self.completed} / {self.failed}",
            f"{'duration (s)':<22} {self.duration_s:.2f}",
            f"{'requests/s':<22} {self.request_throughput:.2f}",
            f"{'input tokens/s':<22} {self.input_token_throughput:.1f}",
            f"{'output tokens/s':<22} {self.output_token_throughput:.1f}",
            f"{'cached prompt tokens':<22} {self.cached_prompt_tokens}",
            stats("TTFT (ms)", self.ttft_ms),
            stats("ITL (ms)", self.itl_ms),
            stats("E2E (ms)", self.e2e_ms),
            f"{'compute (TFLOP/s)':<22} {self.achieved_tflops:.3f}"
            + (
                f" = {100 * self.mfu:.1f}% MFU of {self.matmul_tflops:.0f} bf16 TFLOP/s "
                "measured here"
                if self.mfu is not None
                else ""
            ),
            *(
                [f"{'GPU busy':<22} {100 * self.gpu_busy:.1f}% of the run"]
                if self.gpu_busy is not None
                else []
            ),
        ]


def add_args(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--base-url", default="http://127.0.0.1:8000", help="a running server")
    target.add_argument(
        "--launch-server",
        metavar="SERVE_ARGS",
        help='start `radixserve serve SERVE_ARGS` for the run, e.g. "--max-total-tokens 8192"',
    )
    parser.add_argument(
        "--num-requests", type=int, default=64, help="requests sent in all (default: %(default)s)"
    )
    parser.add_argument(
        "--request-rate", type=float, default=float("inf"), help="requests/s (Poisson); inf: all"
    )
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        help="requests in flight at most (default: no limit)",
    )
    parser.add_argument("--input-len", type=int, default=128, help="prompt tokens per request")
    parser.add_argument("--output-len", type=int, default=64, help="generated tokens per request")
    parser.add_argument(
        "--shared-prefix-len", type=int, default=0, help="leading prompt tokens all requests share"
    )
    parser.add_argument("--vocab-range", type=int, default=1000, help="token ids drawn below this")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the prompts and arrival times (default: 0)"
    )
    parser.add_argument(
        "--keep-cache",
        action="store_true",
        help="do not flush the server's prefix cache first (by default runs start cold)",
    )
    parser.add_argument(
        "--output-json", type=Path, default=None, help="also write the report to this JSON file"
    )


def make_prompts(args: argparse.Namespace) -> list[list[int]]:
    rng = random.Random(args.seed)
    # Ids from 10 up keep clear of the special tokens most vocabularies put first.
    prefix = [rng.randrange(10, args.vocab_range) for _ in range(args.shared_prefix_len)]
    unique_len = max(args.input_len - args.shared_prefix_len, 1)
    return [
        prefix + [rng.randrange(10, args.vocab_range) for _ in range(unique_len)]
        for _ in range(args.num_requests)
    ]


async def send_request(
    session: aiohttp.ClientSession, base_url: str, prompt: list[int], output_len: int
) -> tuple[RequestResult, int]:
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True},
        "stream": True,
    }
    result = RequestResult(ok=False, prompt_tokens=len(prompt))
    cached = 0
    start = time.perf_counter()
    last = start
    try:
        async with session.post(base_url + "/generate", json=body) as reply:
            if reply.status != 200:
                result.error = f"HTTP {reply.status}: {(await reply.text())[:200]}"
                return result, 0
            async for line in reply.content:
                if not line.startswith(b"data: {"):
                    continue
                item = json.loads(line[6:])
                if "error" in item:
                    result.error = item["error"]["message"]
                    return result, 0
                num_new = len(item["output_ids"])
                now = time.perf_counter()
                if num_new:
                    if result.output_tokens == 0:
                        result.ttft = now - start
                        gaps = num_new - 1
                    else:
                        gaps = num_new
                    result.itls.extend([(now - last) / max(gaps, 1)] * gaps)
                    result.output_tokens += num_new
                    last = now
                cached = item["meta_info"]["cached_tokens"]
    except aiohttp.ClientError as exc:
        result.error = repr(exc)
        return result, 0
    result.e2e = time.perf_counter() - start
    result.ok = True
    return result, cached


async def server_info(session: aiohttp.ClientSession, base_url: str) -> dict:
    async with session.get(base_url + "/get_server_info") as reply:
        reply.raise_for_status()
        return await reply.json()


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    ms = np.asarray(values) * 1000.0
    return {
        "mean": float(ms.mean()),
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
    }


async def run_benchmark(args: argparse.Namespace, base_url: str) -> Report:
    prompts = make_prompts(args)
    rng = random.Random(args.seed + 1)
    limit = asyncio.Semaphore(args.max_concurrency or len(prompts))
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        if not args.keep_cache:
            async with session.post(base_url + "/flush_cache") as reply:
                reply.raise_for_status()
        before = await server_info(session, base_url)

        async def limited(prompt: list[int]) -> tuple[RequestResult, int]:
            async with limit:
                return await send_request(session, base_url, prompt, args.output_len)

        started = time.perf_counter()
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.ensure_future(limited(prompt)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        outcomes = await asyncio.gather(*tasks)
        duration = time.perf_counter() - started
        after = await server_info(session, base_url)
    done = [r for r, _ in outcomes if r.ok]
    computed = sum(r.prompt_tokens + r.output_tokens for r in done) - sum(
        cached for r, cached in outcomes if r.ok
    )
    achieved = 2 * after["matmul_parameters"] * computed / duration / 1e12
    on_gpu = after["device"] == "cuda"
    ceiling = measure_matmul_tflops() if on_gpu else None
    for result, _ in outcomes:
        if not result.ok:
            print(f"failed: {result.error}")
    return Report(
        num_requests=len(prompts),
        completed=len(done),
        failed=len(prompts) - len(done),
        duration_s=duration,
        request_throughput=len(done) / duration,
        input_token_throughput=sum(r.prompt_tokens for r in done) / duration,
        output_token_throughput=sum(r.output_tokens for r in done) / duration,
        ttft_ms=percentiles([r.ttft for r in done]),
        itl_ms=percentiles([gap for r in done for gap in r.itls]),
        e2e_ms=percentiles([r.e2e for r in done]),
        cached_prompt_tokens=sum(cached for _, cached in outcomes),
        achieved_tflops=achieved,
        matmul_tflops=ceiling,
        mfu=achieved / ceiling if ceiling else None,
        gpu_busy=(after["gpu_busy_ms"] - before["gpu_busy_ms"]) / 1e3 / duration
        if on_gpu
        else None,
        settings={
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in ("command", "benchmark")
        },
    )


def run(args: argparse.Namespace) -> int:
    if args.launch_server is not None:
        print(f"starting: radixserve serve {args.launch_server}")
        with ServerProcess(shlex.split(args.launch_server)) as server:
            report = asyncio.run(run_benchmark(args, server.base_url))
    else:
        report = asyncio.run(run_benchmark(args, args.base_url.rstrip("/")))
    print("\n".join(report.lines()))
    if args.output_json is not None:
        args.output_json.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 0 if report.failed == 0 else 1
