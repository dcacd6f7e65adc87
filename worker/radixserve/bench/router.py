"""`radixserve bench router`: what routing buys (policies) and what the router costs (overhead).

`--scenario policies` (the fleet issue's workload): N workers and the router in front of them.
Conversations, each a system prompt of about 400 tokens followed by user turns, arrive in a
shuffled order with a fixed number in flight; turn k of a conversation carries the earlier
turns and the worker's real replies, so it is sent only after turn k-1 was answered. The run
is repeated for one worker alone (no router) and for each policy, on the same workers, their
caches flushed before each run (`cache_aware_events`: cache_aware with `--prefix-source events`,
the workers publishing KV events on ports of their own, which the router reads from their
server info); it reports the prefix-cache hit tokens summed over the workers
(`radixserve_prefix_cache_hits_tokens_total`), request throughput and TTFT p50, for a KV pool
that holds every prompt and one that holds about half of them.

`--scenario overhead`: one worker, the router in front of it, `bench serving`'s load driven
at each concurrency directly and through the router in the same run (alternating, twice each),
and the TTFT and per-chunk (inter-token) latency the router adds and the throughput ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shlex
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from radixserve.bench.server_process import ServerProcess, free_port
from radixserve.router.policies import POLICIES

# cache_aware with --prefix-source events: the exact index from the workers' KV events
EVENTS_POLICY = "cache_aware_events"

TOPICS = (
    "astronomy", "baking", "chess", "cycling", "gardening", "geology",
    "jazz", "knitting", "navigation", "origami", "photography", "volcanoes",
)  # fmt: skip
WORDS = [
    "always",
    "answer",
    "with",
    "care",
    "and",
    "keep",
    "every",
    "reply",
    "short",
    "clear",
    "and",
    "polite",
    "never",
    "invent",
    "facts",
    "cite",
    "the",
    "rule",
    "you",
    "follow",
    "when",
    "a",
    "question",
    "is",
    "unclear",
    "ask",
    "one",
    "question",
    "back",
    "prefer",
    "plain",
    "words",
    "over",
    "jargon",
    "explain",
    "each",
    "step",
    "in",
    "order",
    "mention",
    "safety",
    "first",
    "when",
    "tools",
    "or",
    "heat",
    "are",
    "involved",
    "give",
    "numbers",
    "with",
    "units",
    "round",
    "them",
    "sensibly",
    "and",
    "say",
    "when",
    "a",
    "value",
    "is",
    "an",
    "estimate",
    "refuse",
    "requests",
    "that",
    "break",
    "these",
    "rules",
    "but",
    "offer",
    "a",
    "safe",
    "alternative",
    "instead",
    "remember",
    "the",
    "customer",
    "may",
    "be",
    "a",
    "beginner",
    "so",
    "define",
    "any",
    "term",
    "the",
    "first",
    "time",
    "it",
    "appears",
    "in",
    "a",
    "reply",
    "keep",
    "lists",
    "to",
    "five",
    "items",
    "at",
    "most",
    "and",
    "end",
    "with",
    "a",
    "short",
    "summary",
    "sentence",
]
HITS_METRIC = "radixserve_prefix_cache_hits_tokens_total"
QUERIES_METRIC = "radixserve_prefix_cache_queries_tokens_total"


# ---------------------------------------------------------------------------- the workload


@dataclass(frozen=True)
class Conversation:
    system: str
    questions: tuple[str, ...]


def build_conversations(
    num_prompts: int = 12, turns: int = 4, prompt_words: int = 350, seed: int = 0
) -> list[Conversation]:
    """Distinct system prompts (about 1.3 tokens per word) and their users' questions."""
    rng = random.Random(seed)
    conversations = []
    for index in range(num_prompts):
        topic = TOPICS[index % len(TOPICS)]
        body = " ".join(rng.choice(WORDS) for _ in range(prompt_words))
        system = f"You are assistant {index}, an expert in {topic}. House rules: {body}."
        questions = tuple(
            f"Question {turn + 1} about {topic}: what is the {rng.choice(WORDS)} rule about "
            f"{rng.choice(WORDS)}?"
            for turn in range(turns)
        )
        conversations.append(Conversation(system, questions))
    return conversations


def arrival_order(conversations: Sequence[Conversation], seed: int = 0) -> list[int]:
    """Conversation indices, each once per turn, shuffled: the k-th occurrence is turn k."""
    order = [i for i, c in enumerate(conversations) for _ in c.questions]
    random.Random(seed).shuffle(order)
    return order


@dataclass
class WorkloadRun:
    requests: int
    duration_s: float
    ttft_s: list[float]
    failures: list[str]

    @property
    def throughput(self) -> float:
        return self.requests / self.duration_s

    @property
    def ttft_p50_ms(self) -> float:
        return 1000 * statistics.median(self.ttft_s) if self.ttft_s else 0.0


async def chat_turn(session: aiohttp.ClientSession, base_url: str, body: dict) -> tuple[str, float]:
    """One streamed chat completion: its text and time to first token."""
    started = time.perf_counter()
    ttft, parts = 0.0, []
    async with session.post(base_url + "/v1/chat/completions", json=body) as reply:
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}: {(await reply.text())[:300]}")
        async for line in reply.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            for choice in event.get("choices", []):
                text = choice.get("delta", {}).get("content")
                if text:
                    ttft = ttft or time.perf_counter() - started
                    parts.append(text)
    return "".join(parts), ttft


async def run_workload(
    base_url: str,
    model: str,
    conversations: Sequence[Conversation],
    order: Sequence[int],
    *,
    concurrency: int = 4,
    max_tokens: int = 8,
) -> WorkloadRun:
    """Send every turn in `order`, `concurrency` at a time, each after its previous turn."""
    histories = [[{"role": "system", "content": c.system}] for c in conversations]
    answered = [[asyncio.Event() for _ in c.questions] for c in conversations]
    queue: list[tuple[int, int]] = []
    seen = [0] * len(conversations)
    for index in order:
        queue.append((index, seen[index]))
        seen[index] += 1
    queue.reverse()
    ttfts: list[float] = []
    failures: list[str] = []

    async def client(session: aiohttp.ClientSession) -> None:
        while queue:
            index, turn = queue.pop()
            if turn:
                await answered[index][turn - 1].wait()
            conversation = conversations[index]
            histories[index].append({"role": "user", "content": conversation.questions[turn]})
            body = {
                "model": model,
                "messages": list(histories[index]),
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
            }
            try:
                reply, ttft = await chat_turn(session, base_url, body)
                ttfts.append(ttft)
            except (RuntimeError, aiohttp.ClientError) as exc:
                failures.append(repr(exc))
                reply = ""
            histories[index].append({"role": "assistant", "content": reply})
            answered[index][turn].set()

    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        duration = time.perf_counter() - started
    return WorkloadRun(len(order), duration, ttfts, failures)


# ---------------------------------------------------------------------------- the fleet


def metric_sum(exposition: str, name: str) -> float:
    """Sum of a series over its label sets in a Prometheus text exposition."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
    return sum(float(value) for value in pattern.findall(exposition))


async def cache_counters(worker_urls: Sequence[str]) -> tuple[float, float]:
    """(hit tokens, looked-up tokens) of the prefix caches, summed over the workers."""
    hits = queries = 0.0
    async with aiohttp.ClientSession() as session:
        for url in worker_urls:
            async with session.get(url + "/metrics") as reply:
                text = await reply.text()
            hits += metric_sum(text, HITS_METRIC)
            queries += metric_sum(text, QUERIES_METRIC)
    return hits, queries


async def flush_caches(worker_urls: Sequence[str]) -> None:
    async with aiohttp.ClientSession() as session:
        for url in worker_urls:
            async with session.post(url + "/flush_cache") as reply:
                reply.raise_for_status()


async def served_model(base_url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(base_url + "/v1/models") as reply:
        return (await reply.json())["data"][0]["id"]


@dataclass
class PolicyResult:
    """One run of the workload: routed by `policy` ("single": one worker, no router)."""

    policy: str
    kv_tokens: int
    requests: int
    failures: int
    duration_s: float
    requests_per_s: float
    ttft_p50_ms: float
    hit_tokens: float
    query_tokens: float
    requests_by_worker: dict[str, int] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


@contextlib.contextmanager
def started_workers(
    count: int, serve_args: list[str], log_dir: Path | None, *, kv_events: bool = False
) -> Iterator[list]:
    """`count` workers started together (their model loads overlap), stopped together; with
    `kv_events` each publishes its KV events on a port of its own."""
    workers = [
        ServerProcess(
            [
                *serve_args,
                *(["--kv-events-endpoint", f"tcp://*:{free_port()}"] * kv_events),
            ],
            log_dir / f"worker-{i}.log" if log_dir else None,
        )
        for i in range(count)
    ]
    try:
        for worker in workers:
            worker.wait_ready()
        yield workers
    finally:
        for worker in workers:
            worker.stop()


@contextlib.contextmanager
def started_router(
    worker_urls: Sequence[str], router_args: list[str], log_path: Path | None = None
) -> Iterator[ServerProcess]:
    args = [arg for url in worker_urls for arg in ("--worker-url", url)] + router_args
    with ServerProcess(args, log_path, subcommand="router") as router:
        yield router


def routed_counts(router: ServerProcess) -> dict[str, int]:
    _, body = router.get("/metrics")
    counts: dict[str, int] = {}
    pattern = re.compile(r"^radixserve_router_requests_total\{([^}]*)\} (\S+)$", re.MULTILINE)
    for labels, value in pattern.findall(body.decode()):
        worker = re.search(r'worker="([^"]*)"', labels)
        if worker:
            counts[worker.group(1)] = counts.get(worker.group(1), 0) + int(float(value))
    return counts


def run_policy(
    policy: str,
    worker_urls: Sequence[str],
    conversations: Sequence[Conversation],
    order: Sequence[int],
    *,
    kv_tokens: int,
    concurrency: int,
    max_tokens: int,
    router_args: Sequence[str] = (),
    log_dir: Path | None = None,
) -> PolicyResult:
    """The workload once, caches flushed first: through a router, or straight to one worker."""
    asyncio.run(flush_caches(worker_urls))
    before = asyncio.run(cache_counters(worker_urls))
    routed: dict[str, int] = {}
    if policy == "single":
        model = asyncio.run(served_model(worker_urls[0]))
        run = asyncio.run(
            run_workload(
                worker_urls[0], model, conversations, order,
                concurrency=concurrency, max_tokens=max_tokens,
            )
        )  # fmt: skip
    else:
        log = log_dir / f"router-{policy}-{kv_tokens}.log" if log_dir else None
        if policy == EVENTS_POLICY:
            args = ["--policy", "cache_aware", "--prefix-source", "events"]
        else:
            args = ["--policy", policy]
        args += ["--health-check-interval", "0.5", *router_args]
        with started_router(worker_urls, args, log) as router:
            model = asyncio.run(served_model(router.base_url))
            run = asyncio.run(
                run_workload(
                    router.base_url, model, conversations, order,
                    concurrency=concurrency, max_tokens=max_tokens,
                )
            )  # fmt: skip
            routed = routed_counts(router)
    after = asyncio.run(cache_counters(worker_urls))
    return PolicyResult(
        policy=policy,
        kv_tokens=kv_tokens,
        requests=run.requests,
        failures=len(run.failures),
        duration_s=run.duration_s,
        requests_per_s=run.throughput,
        ttft_p50_ms=run.ttft_p50_ms,
        hit_tokens=after[0] - before[0],
        query_tokens=after[1] - before[1],
        requests_by_worker=routed,
    )


def compare_policies(args: argparse.Namespace) -> list[PolicyResult]:
    conversations = build_conversations(args.num_prompts, args.turns, args.prompt_words, args.seed)
    order = arrival_order(conversations, args.seed)
    results = []
    for kv_tokens in args.kv_tokens:
        serve_args = [*shlex.split(args.worker_args), "--max-total-tokens", str(kv_tokens)]
        print(f"starting {args.num_workers} workers: radixserve serve {shlex.join(serve_args)}")
        with started_workers(
            args.num_workers, serve_args, args.log_dir, kv_events=EVENTS_POLICY in args.policies
        ) as workers:
            urls = [worker.base_url for worker in workers]
            for policy in ("single", *args.policies):
                result = run_policy(
                    policy, urls, conversations, order,
                    kv_tokens=kv_tokens, concurrency=args.concurrency,
                    max_tokens=args.max_tokens, log_dir=args.log_dir,
                )  # fmt: skip
                print(policy_line(result), flush=True)
                results.append(result)
    return results


def policy_line(r: PolicyResult) -> str:
    return (
        f"kv {r.kv_tokens:>6}  {r.policy:<18} hit tokens {r.hit_tokens:8.0f}"
        f" ({100 * r.hit_rate:4.1f}%)  {r.requests_per_s:5.2f} req/s"
        f"  TTFT p50 {r.ttft_p50_ms:7.1f} ms  failed {r.failures}"
    )


# ---------------------------------------------------------------------------- overhead


def measure_overhead(args: argparse.Namespace) -> list[dict]:
    from radixserve.bench.serving import run_benchmark

    rows = []
    serve_args = shlex.split(args.worker_args)
    print(f"starting: radixserve serve {shlex.join(serve_args)}")
    with (
        started_workers(1, serve_args, args.log_dir) as (worker,),
        started_router([worker.base_url], ["--health-check-interval", "1"]) as router,
    ):
        targets = {"direct": worker.base_url, "router": router.base_url}
        for concurrency in args.overhead_concurrency:
            load = argparse.Namespace(
                num_requests=max(args.overhead_requests, concurrency),
                request_rate=float("inf"),
                max_concurrency=concurrency,
                input_len=args.input_len,
                output_len=args.output_len,
                shared_prefix_len=0,
                vocab_range=1000,
                seed=args.seed,
                keep_cache=False,
            )
            reports: dict[str, list] = {"direct": [], "router": []}
            for path in ("direct", "router", "router", "direct"):  # drift cancels out
                reports[path].append(asyncio.run(run_benchmark(load, targets[path])))
            row = overhead_row(concurrency, reports)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def overhead_row(concurrency: int, reports: dict[str, list]) -> dict:
    def mean(path: str, pick) -> float:
        return statistics.mean(pick(report) for report in reports[path])

    row: dict = {"concurrency": concurrency}
    for path in ("direct", "router"):
        row[f"{path}_ttft_p50_ms"] = mean(path, lambda r: r.ttft_ms["p50"])
        row[f"{path}_itl_p50_ms"] = mean(path, lambda r: r.itl_ms["p50"])
        row[f"{path}_output_tokens_per_s"] = mean(path, lambda r: r.output_token_throughput)
        row[f"{path}_failed"] = sum(r.failed for r in reports[path])
    row["added_ttft_p50_ms"] = row["router_ttft_p50_ms"] - row["direct_ttft_p50_ms"]
    row["added_itl_p50_ms"] = row["router_itl_p50_ms"] - row["direct_itl_p50_ms"]
    row["throughput_ratio"] = row["router_output_tokens_per_s"] / row["direct_output_tokens_per_s"]
    return row


# ---------------------------------------------------------------------------- CLI


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scenario",
        choices=("policies", "overhead"),
        default="policies",
        help="policies: prefix-cache hits and throughput per routing policy; overhead: the "
        "latency the router adds in front of one worker (default: %(default)s)",
    )
    parser.add_argument(
        "--worker-args",
        default="--device cpu --max-running-requests 8",
        help="flags of every `radixserve serve` the benchmark starts",
    )
    parser.add_argument(
        "--worker-threads",
        type=int,
        default=None,
        help="OMP_NUM_THREADS of the workers (e.g. 1 when three CPU workers share two cores)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the conversations and prompts (default: 0)"
    )
    parser.add_argument("--log-dir", type=Path, default=None, help="keep the servers' logs here")
    parser.add_argument(
        "--output-json", type=Path, default=None, help="also write the results to this JSON file"
    )
    policies = parser.add_argument_group("policies scenario")
    policies.add_argument(
        "--num-workers", type=int, default=3, help="workers behind the router (default: 3)"
    )
    policies.add_argument(
        "--policies",
        type=lambda s: s.split(","),
        default=[*POLICIES, EVENTS_POLICY],
        help="routing policies to compare, comma-separated; cache_aware_events is cache_aware "
        f"with --prefix-source events (default: {','.join([*POLICIES, EVENTS_POLICY])})",
    )
    policies.add_argument(
        "--kv-tokens",
        type=_ints,
        default=[16384, 2400],
        help="each worker's --max-total-tokens, one fleet per value (comma-separated)",
    )
    policies.add_argument(
        "--num-prompts", type=int, default=12, help="conversations, each its own system prompt"
    )
    policies.add_argument(
        "--turns", type=int, default=4, help="user turns per conversation (default: 4)"
    )
    policies.add_argument(
        "--prompt-words",
        type=int,
        default=350,
        help="words of each system prompt (about 400 tokens at the default 350)",
    )
    policies.add_argument(
        "--concurrency", type=int, default=4, help="conversations in flight at once (default: 4)"
    )
    policies.add_argument(
        "--max-tokens", type=int, default=8, help="tokens generated per turn (default: 8)"
    )
    overhead = parser.add_argument_group("overhead scenario")
    overhead.add_argument(
        "--overhead-concurrency",
        type=_ints,
        default=[1, 32],
        help="concurrencies to measure, comma-separated (default: 1,32)",
    )
    overhead.add_argument(
        "--overhead-requests",
        type=int,
        default=32,
        help="requests per measurement (at least the concurrency; default: 32)",
    )
    overhead.add_argument(
        "--input-len", type=int, default=128, help="prompt tokens per request (default: 128)"
    )
    overhead.add_argument(
        "--output-len", type=int, default=32, help="generated tokens per request (default: 32)"
    )


def run(args: argparse.Namespace) -> int:
    if args.log_dir is not None:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    if args.worker_threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(args.worker_threads)  # inherited by the workers
    load_before = os.getloadavg()
    if args.scenario == "policies":
        results = [asdict(r) | {"hit_rate": r.hit_rate} for r in compare_policies(args)]
        failed = sum(r["failures"] for r in results)
    else:
        results = measure_overhead(args)
        failed = sum(r["direct_failed"] + r["router_failed"] for r in results)
    if args.output_json is not None:
        settings = {k: str(v) for k, v in vars(args).items() if k not in ("command", "benchmark")}
        # Other work on the machine skews every timing; the hit counts do not depend on it.
        machine = {"load_average_before": load_before, "load_average_after": os.getloadavg()}
        args.output_json.write_text(
            json.dumps({"settings": settings, "machine": machine, "results": results}, indent=2)
            + "\n"
        )
    return 0 if failed == 0 else 1
