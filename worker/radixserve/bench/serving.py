"""`radixserve bench serving`: load a running server the way clients would and measure it.

N requests arrive as a Poisson process at `--request-rate` (or all at once), optionally capped
at `--max-concurrency` in flight, and outputs have a fixed length. `--api` picks the endpoint
they stream through:

- `generate` (the default): the native `/generate` endpoint, with random token-id prompts (every
  model, tokenizer or not, can serve them), optionally behind a shared prefix so the radix cache
  has something to hit, and `ignore_eos`. Its chunks carry token ids, so time to first token,
  inter-token latency and end-to-end latency are measured per token, not per decoded fragment.
- `chat`, `completions`, `responses`, `messages`: `/v1/chat/completions`, `/v1/completions`,
  `/v1/responses` and `/v1/messages` (Anthropic), with text prompts of random common words
  (one token each in the usual BPE vocabularies: `--input-len` words, plus the chat template's
  tokens on all but `completions`), the same words for every API. Chat and completions send
  `ignore_eos`; Responses and Messages have no such field (an unknown one is ignored or, with
  `--strict-api`, refused), so they ask `max_output_tokens` / `max_tokens` and stop early only
  where the model samples its end of turn (a random-weight model all but never does): compare
  them per output token. TTFT is the first text-bearing event; ITL is the gap between two
  text-bearing events (one per token unless the stream fell behind and merged some); TPOT is
  (E2E - TTFT) / (output tokens - 1) per request, with the output tokens from the reply's
  usage, which counts every token whatever the chunking.

`--turns T` (generate only) makes each of the `--num-requests` prompts the first turn of a
session: turn t+1 sends the whole conversation so far (every prompt and reply, the replies'
own token ids) plus `--turn-len` new tokens, once turn t's reply is complete, so a session's
prefix grows as a chat's does and the radix cache (and its host and disk tiers) can hold it
between turns. Sessions start at the set arrivals; figures pool every turn.

Several APIs (`--api chat,responses,messages`) run one after another against one server, each
from a flushed prefix cache, the same prompts and arrivals for each, `--rounds` times (odd
rounds in the given order, even ones reversed), after `--warmup-requests` unmeasured requests
through each; the report gives each API's figures and a table beside the reference API (chat
when it runs, else the first). With `RADIXSERVE_API_KEY` set, every request carries it as a
Bearer token (a server run with `--api-key`).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from radixserve.bench.offline import measure_matmul_tflops
from radixserve.bench.server_process import ServerProcess

API_PATHS = {
    "generate": "/generate",
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
TEXT_APIS = ("chat", "completions", "responses", "messages")
# One token each (with the space before it) in the SmolLM2 and Llama-3 vocabularies.
_WORD_TEXT = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend "
    "father power hour game line end member law car city community name president team "
    "minute idea kid body information back parent face others level office door health "
    "person art war history party result change morning reason research girl guy moment "
    "air teacher force education"
)
WORDS = _WORD_TEXT.split()


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itls: list[float] = field(default_factory=list)
    error: str = ""
    cached_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)  # generate: what the next turn appends

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


@dataclass
class Run:
    """One API's pass over the prompts: its results and the server's counters around it."""

    results: list[RequestResult]
    duration: float
    before: dict
    after: dict


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
    api: str = "generate"
    output_tokens: int = 0
    tpot_ms: dict[str, float] = field(default_factory=dict)  # (E2E - TTFT) / (tokens - 1)

    def lines(self) -> list[str]:
        def stats(name: str, values: dict[str, float]) -> str:
            return f"{name:<22} " + "  ".join(f"{k} {v:9.1f}" for k, v in values.items())

        return [
            f"{'API':<22} {self.api} ({API_PATHS[self.api]})",
            f"{'completed / failed':<22} {self.completed} / {self.failed}",
            f"{'duration (s)':<22} {self.duration_s:.2f}",
            f"{'requests/s':<22} {self.request_throughput:.2f}",
            f"{'input tokens/s':<22} {self.input_token_throughput:.1f}",
            f"{'output tokens/s':<22} {self.output_token_throughput:.1f}",
            f"{'cached prompt tokens':<22} {self.cached_prompt_tokens}",
            stats("TTFT (ms)", self.ttft_ms),
            stats("ITL (ms)", self.itl_ms),
            stats("TPOT (ms)", self.tpot_ms),
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


def parse_apis(value: str) -> list[str]:
    apis = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in apis if name not in API_PATHS]
    if unknown or not apis:
        raise argparse.ArgumentTypeError(
            f"unknown API {', '.join(unknown) or value!r} (choose from {', '.join(API_PATHS)})"
        )
    if len(set(apis)) != len(apis):
        raise argparse.ArgumentTypeError(f"an API is named twice in {value!r}")
    return apis


def add_args(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--base-url", default="http://127.0.0.1:8000", help="a running server")
    target.add_argument(
        "--launch-server",
        metavar="SERVE_ARGS",
        help='start `radixserve serve SERVE_ARGS` for the run, e.g. "--max-total-tokens 8192"',
    )
    parser.add_argument(
        "--server-log",
        type=Path,
        default=None,
        help="with --launch-server: write the server's output to this file (default: discard)",
    )
    parser.add_argument(
        "--api",
        type=parse_apis,
        default=["generate"],
        metavar="API[,API...]",
        help=f"endpoint(s) to drive, of {', '.join(API_PATHS)}; several run one after another "
        "against one server and are reported side by side (default: generate)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="passes over the APIs, every other one in reverse order (default: %(default)s)",
    )
    parser.add_argument(
        "--warmup-requests",
        type=int,
        default=0,
        help="unmeasured requests through each API before the measured ones (default: 0)",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature sent to every API (default: the server's)",
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
        "--turns",
        type=int,
        default=1,
        help="generate: turns per session; above 1 each of --num-requests prompts opens a "
        "session whose next turn appends its reply and --turn-len new tokens, sent when the "
        "reply is complete (a multi-turn chat; default: 1)",
    )
    parser.add_argument(
        "--turn-len", type=int, default=64, help="new user tokens per later turn (default: 64)"
    )
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


def make_text_prompts(args: argparse.Namespace) -> list[str]:
    """The text APIs' prompts: `--input-len` random words (about a token each), the first
    `--shared-prefix-len` of them shared."""
    rng = random.Random(args.seed)
    prefix = [rng.choice(WORDS) for _ in range(args.shared_prefix_len)]
    unique_len = max(args.input_len - args.shared_prefix_len, 1)
    return [
        " ".join(prefix + [rng.choice(WORDS) for _ in range(unique_len)])
        for _ in range(args.num_requests)
    ]


async def send_request(
    session: aiohttp.ClientSession, base_url: str, prompt: list[int], output_len: int
) -> RequestResult:
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True},
        "stream": True,
    }
    result = RequestResult(ok=False, prompt_tokens=len(prompt))
    start = time.perf_counter()
    last = start
    try:
        async with session.post(base_url + "/generate", json=body) as reply:
            if reply.status != 200:
                result.error = f"HTTP {reply.status}: {(await reply.text())[:200]}"
                return result
            async for line in reply.content:
                if not line.startswith(b"data: {"):
                    continue
                item = json.loads(line[6:])
                if "error" in item:
                    result.error = item["error"]["message"]
                    return result
                num_new = len(item["output_ids"])
                result.output_ids.extend(item["output_ids"])
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
                result.cached_tokens = item["meta_info"]["cached_tokens"]
    except aiohttp.ClientError as exc:
        result.error = repr(exc)
        return result
    result.e2e = time.perf_counter() - start
    result.ok = True
    return result


def text_body(api: str, model: str, prompt: str, output_len: int, temperature: float | None):
    """The request of `api` for `prompt`, streaming, `output_len` tokens at most."""
    sampling: dict[str, Any] = {"stream": True}
    if temperature is not None:
        sampling["temperature"] = temperature
    messages = [{"role": "user", "content": prompt}]
    usage = {"stream_options": {"include_usage": True}, "ignore_eos": True}
    if api == "chat":
        return {"model": model, "messages": messages, "max_tokens": output_len, **usage, **sampling}
    if api == "completions":
        return {"model": model, "prompt": prompt, "max_tokens": output_len, **usage, **sampling}
    if api == "responses":
        return {
            "model": model,
            "input": prompt,
            "max_output_tokens": output_len,
            "store": False,
            **sampling,
        }
    return {"model": model, "max_tokens": output_len, "messages": messages, **sampling}


def read_event(api: str, item: dict) -> tuple[bool, str | None, dict | None]:
    """(whether the event carries output text, an error message, usage as (prompt, output,
    cached) token counts) of one streamed JSON object of `api`."""
    if api in ("chat", "completions"):
        if "error" in item:
            return False, str(item["error"].get("message", item["error"])), None
        usage = item.get("usage")
        counts = None
        if usage:
            details = usage.get("prompt_tokens_details") or {}
            counts = {
                "prompt": usage["prompt_tokens"],
                "output": usage["completion_tokens"],
                "cached": details.get("cached_tokens", 0),
            }
        choices = item.get("choices") or []
        if not choices:
            return False, None, counts
        text = (
            choices[0].get("text")
            if api == "completions"
            else (choices[0].get("delta") or {}).get("content")
        )
        return bool(text), None, counts
    kind = item.get("type")
    if api == "responses":
        if kind == "response.output_text.delta":
            return bool(item.get("delta")), None, None
        if kind in ("error", "response.failed"):
            error = item.get("error") or (item.get("response") or {}).get("error") or item
            return False, str(error.get("message", error)), None
        if kind in ("response.completed", "response.incomplete"):
            usage = item["response"]["usage"]
            cached = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
            return (
                False,
                None,
                {
                    "prompt": usage["input_tokens"],
                    "output": usage["output_tokens"],
                    "cached": cached,
                },
            )
        return False, None, None
    # messages
    if kind == "content_block_delta":
        delta = item.get("delta") or {}
        return delta.get("type") == "text_delta" and bool(delta.get("text")), None, None
    if kind == "error":
        error = item.get("error") or {}
        return False, str(error.get("message", error)), None
    if kind == "message_delta":
        usage = item["usage"]
        cached = usage.get("cache_read_input_tokens", 0)
        return (
            False,
            None,
            {
                "prompt": usage["input_tokens"] + cached,
                "output": usage["output_tokens"],
                "cached": cached,
            },
        )
    return False, None, None


async def send_text_request(
    session: aiohttp.ClientSession,
    base_url: str,
    api: str,
    body: dict,
    prompt_words: int,
) -> RequestResult:
    """Stream one request of a text API; time its text-bearing events."""
    result = RequestResult(ok=False, prompt_tokens=prompt_words)
    start = time.perf_counter()
    last = start
    events = 0
    usage: dict | None = None
    try:
        async with session.post(base_url + API_PATHS[api], json=body) as reply:
            if reply.status != 200:
                result.error = f"HTTP {reply.status}: {(await reply.text())[:200]}"
                return result
            async for line in reply.content:
                if not line.startswith(b"data: {"):
                    continue
                now = time.perf_counter()
                has_text, error, counts = read_event(api, json.loads(line[6:]))
                if error is not None:
                    result.error = error
                    return result
                if counts is not None:
                    usage = counts
                if has_text:
                    if events == 0:
                        result.ttft = now - start
                    else:
                        result.itls.append(now - last)
                    events += 1
                    last = now
    except aiohttp.ClientError as exc:
        result.error = repr(exc)
        return result
    result.e2e = time.perf_counter() - start
    if usage is None:
        result.error = "the stream ended without usage"
        return result
    if events == 0:
        result.ttft = result.e2e
    result.prompt_tokens = usage["prompt"]
    result.output_tokens = usage["output"]
    result.cached_tokens = usage["cached"]
    result.ok = True
    return result


async def server_info(session: aiohttp.ClientSession, base_url: str) -> dict:
    async with session.get(base_url + "/get_server_info") as reply:
        reply.raise_for_status()
        return await reply.json()


async def model_name(session: aiohttp.ClientSession, base_url: str) -> str:
    async with session.get(base_url + "/v1/models") as reply:
        reply.raise_for_status()
        return (await reply.json())["data"][0]["id"]


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    ms = np.asarray(values) * 1000.0
    return {
        "mean": float(ms.mean()),
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
    }


async def run_api(
    args: argparse.Namespace,
    session: aiohttp.ClientSession,
    base_url: str,
    api: str,
    model: str | None,
    count: int | None = None,
) -> Run:
    """One pass of `api` over the prompts (the first `count` of them), at the set arrivals."""
    if api == "generate":
        prompts: list[Any] = make_prompts(args)
    else:
        prompts = make_text_prompts(args)
    prompts = prompts[:count] if count is not None else prompts
    rng = random.Random(args.seed + 1)
    limit = asyncio.Semaphore(args.max_concurrency or len(prompts))
    if not args.keep_cache:
        async with session.post(base_url + "/flush_cache") as reply:
            reply.raise_for_status()
    before = await server_info(session, base_url)

    async def limited(prompt: Any) -> RequestResult:
        async with limit:
            if api == "generate":
                return await send_request(session, base_url, prompt, args.output_len)
            body = text_body(api, model or "", prompt, args.output_len, args.temperature)
            return await send_text_request(session, base_url, api, body, len(prompt.split()))

    started = time.perf_counter()
    tasks = []
    turns = getattr(args, "turns", 1)
    for i, prompt in enumerate(prompts):
        if turns > 1:
            later = session_turns(args, i)
            tasks.append(asyncio.ensure_future(run_session(prompt, later, limited)))
        else:
            tasks.append(asyncio.ensure_future(limited(prompt)))
        if args.request_rate != float("inf"):
            await asyncio.sleep(rng.expovariate(args.request_rate))
    gathered = await asyncio.gather(*tasks)
    results = [r for item in gathered for r in (item if isinstance(item, list) else [item])]
    duration = time.perf_counter() - started
    after = await server_info(session, base_url)
    return Run(list(results), duration, before, after)


def session_turns(args: argparse.Namespace, session: int) -> list[list[int]]:
    """The new user tokens of a session's turns after its first (seeded per session)."""
    rng = random.Random(f"{args.seed}-turns-{session}")
    return [
        [rng.randrange(10, args.vocab_range) for _ in range(args.turn_len)]
        for _ in range(args.turns - 1)
    ]


async def run_session(
    first: list[int],
    later: list[list[int]],
    send: Callable[[list[int]], Awaitable[RequestResult]],
) -> list[RequestResult]:
    """A multi-turn session: each turn is the whole conversation so far (prompts and replies)
    plus its new tokens, sent once the previous reply is complete; a failed turn ends it."""
    results = [await send(first)]
    context = first
    for new in later:
        if not results[-1].ok:
            break
        context = context + results[-1].output_ids + new
        results.append(await send(context))
    return results


@functools.cache
def matmul_ceiling() -> float | None:
    return measure_matmul_tflops()


def make_report(args: argparse.Namespace, api: str, runs: list[Run]) -> Report:
    """`api`'s figures over its runs (their results pooled, their durations summed)."""
    results = [r for run in runs for r in run.results]
    done = [r for r in results if r.ok]
    duration = sum(run.duration for run in runs)
    cached = sum(r.cached_tokens for r in done)
    computed = sum(r.prompt_tokens + r.output_tokens for r in done) - cached
    after = runs[-1].after
    achieved = 2 * after["matmul_parameters"] * computed / duration / 1e12
    on_gpu = after["device"] == "cuda"
    ceiling = matmul_ceiling() if on_gpu else None
    busy_ms = sum(run.after["gpu_busy_ms"] - run.before["gpu_busy_ms"] for run in runs)
    for result in results:
        if not result.ok:
            print(f"failed ({api}): {result.error}")
    tpots = [r.tpot for r in done if r.tpot is not None]
    return Report(
        num_requests=len(results),
        completed=len(done),
        failed=len(results) - len(done),
        duration_s=duration,
        request_throughput=len(done) / duration,
        input_token_throughput=sum(r.prompt_tokens for r in done) / duration,
        output_token_throughput=sum(r.output_tokens for r in done) / duration,
        ttft_ms=percentiles([r.ttft for r in done]),
        itl_ms=percentiles([gap for r in done for gap in r.itls]),
        e2e_ms=percentiles([r.e2e for r in done]),
        cached_prompt_tokens=cached,
        achieved_tflops=achieved,
        matmul_tflops=ceiling,
        mfu=achieved / ceiling if ceiling else None,
        gpu_busy=busy_ms / 1e3 / duration if on_gpu else None,
        settings={
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in ("command", "benchmark")
        },
        api=api,
        output_tokens=sum(r.output_tokens for r in done),
        tpot_ms=percentiles([t for t in tpots if t is not None]),
    )


async def run_benchmark_apis(args: argparse.Namespace, base_url: str) -> dict[str, Report]:
    """Every API of `args.api`, `args.rounds` times, against the server at `base_url`."""
    key = os.environ.get("RADIXSERVE_API_KEY")  # a server run with --api-key: its key
    headers = {"Authorization": f"Bearer {key}"} if key else None
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    runs: dict[str, list[Run]] = {api: [] for api in args.api}
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers=headers
    ) as session:
        model = None
        if any(api in TEXT_APIS for api in args.api):
            model = await model_name(session, base_url)
        if args.warmup_requests > 0:
            for api in args.api:
                await run_api(args, session, base_url, api, model, count=args.warmup_requests)
        for round_index in range(args.rounds):
            order = args.api if round_index % 2 == 0 else args.api[::-1]
            for api in order:
                runs[api].append(await run_api(args, session, base_url, api, model))
    return {api: make_report(args, api, api_runs) for api, api_runs in runs.items()}


# what `run_benchmark` assumes of a Namespace that lacks the fields `--api` brought
SINGLE_API_DEFAULTS: dict[str, Any] = {
    "api": ["generate"],
    "rounds": 1,
    "warmup_requests": 0,
    "temperature": None,
}


async def run_benchmark(args: argparse.Namespace, base_url: str) -> Report:
    """The first API of `args.api` (a single-API run, as before `--api` took a list)."""
    settings = {**SINGLE_API_DEFAULTS, **vars(args)}  # callers that predate --api omit them
    settings["api"] = settings["api"][:1]
    reports = await run_benchmark_apis(argparse.Namespace(**settings), base_url)
    return next(iter(reports.values()))


def reference_api(apis: list[str]) -> str:
    return "chat" if "chat" in apis else apis[0]


def comparison(reports: dict[str, Report]) -> list[dict[str, Any]]:
    """One row per API beside the reference API (chat when it ran, else the first)."""
    ref = reports[reference_api(list(reports))]
    rows = []
    for api, report in reports.items():
        ref_tpot = ref.tpot_ms.get("mean") or 0.0
        rows.append(
            {
                "api": api,
                "completed": report.completed,
                "num_requests": report.num_requests,
                "output_tokens": report.output_tokens,
                "output_token_throughput": report.output_token_throughput,
                "ttft_p50_ms": report.ttft_ms["p50"],
                "ttft_p99_ms": report.ttft_ms["p99"],
                "itl_p50_ms": report.itl_ms["p50"],
                "itl_p99_ms": report.itl_ms["p99"],
                "tpot_mean_ms": report.tpot_ms.get("mean", 0.0),
                # this API's output tokens/s over the reference's: the issue's "per-token
                # cost against chat, >= 0.97x" bar reads this ratio
                "throughput_vs_ref": report.output_token_throughput / ref.output_token_throughput
                if ref.output_token_throughput
                else None,
                # the reference's mean TPOT over this API's (above 1: this API is faster)
                "tpot_vs_ref": ref_tpot / report.tpot_ms["mean"]
                if ref_tpot and report.tpot_ms.get("mean")
                else None,
            }
        )
    return rows


def table_lines(reports: dict[str, Report]) -> list[str]:
    ref = reference_api(list(reports))
    header = (
        f"{'API':<12} {'requests':>9} {'out tok':>8} {'out tok/s':>10} "
        f"{'TTFT p50/p99 ms':>17} {'ITL p50/p99 ms':>16} {'TPOT ms':>8} "
        f"{'tok/s vs ' + ref:>15} {'TPOT vs ' + ref:>14}"
    )

    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}x"

    lines = [header]
    for row in comparison(reports):
        lines.append(
            f"{row['api']:<12} {row['completed']:>4}/{row['num_requests']:<4} "
            f"{row['output_tokens']:>8} {row['output_token_throughput']:>10.1f} "
            f"{row['ttft_p50_ms']:>8.1f}/{row['ttft_p99_ms']:<8.1f} "
            f"{row['itl_p50_ms']:>7.2f}/{row['itl_p99_ms']:<8.2f} {row['tpot_mean_ms']:>8.2f} "
            f"{ratio(row['throughput_vs_ref']):>15} {ratio(row['tpot_vs_ref']):>14}"
        )
    lines += [
        f"tok/s vs {ref}: this API's output tokens/s / {ref}'s, each over its own runs (the "
        "per-token cost bar: >= 0.97x means at most ~3% dearer per token)",
        f"TPOT vs {ref}: {ref}'s mean (E2E - TTFT) / (output tokens - 1) / this API's "
        "(below 1: this API spends longer per token)",
        "ITL: gaps between text-bearing stream events (native /generate: per token)",
    ]
    return lines


def run(args: argparse.Namespace) -> int:
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    if args.turns < 1 or args.turn_len < 1:
        raise SystemExit("--turns and --turn-len must be at least 1")
    if args.turns > 1 and args.api != ["generate"]:
        raise SystemExit("--turns above 1 drives --api generate (token ids) only")
    if args.launch_server is not None:
        print(f"starting: radixserve serve {args.launch_server}")
        with ServerProcess(shlex.split(args.launch_server), args.server_log) as server:
            reports = asyncio.run(run_benchmark_apis(args, server.base_url))
    else:
        reports = asyncio.run(run_benchmark_apis(args, args.base_url.rstrip("/")))
    for report in reports.values():
        print("\n".join(report.lines()))
        print()
    if len(reports) == 1:
        payload: dict[str, Any] = asdict(next(iter(reports.values())))
    else:
        print("\n".join(table_lines(reports)))
        payload = {
            "reference_api": reference_api(list(reports)),
            "comparison": comparison(reports),
            "apis": {api: asdict(report) for api, report in reports.items()},
        }
    if args.output_json is not None:
        args.output_json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0 if all(report.failed == 0 for report in reports.values()) else 1
