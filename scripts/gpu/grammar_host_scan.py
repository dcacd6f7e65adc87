"""Where a constrained decode step's host time goes, on the machine it runs on (issue 14).

bench_grammar.py found the host's bitmask fill for 64 JSON-constrained rows at about 6 ms a
step on the device (8 xgrammar threads), more than the 5.4 ms forward pass it should hide
under. This scan times the pieces apart on the same states, so that the device's CPU (gVisor)
says whether xgrammar's threads help there: 64 matchers of bench_grammar's schema, each walked
a different number of tokens (drawn uniformly among the allowed ones, as a random model does)
into its objects and strings; then the batched fill at 1..16 threads, one matcher at a time,
and the accepts one by one and batched; then the server's own accept
(`XGrammarBackend.accept_tokens`, the step's rows split over the backend's threads) on the same
states at 1, 2, 4, 8 and 16 threads.

Usage: python3 scripts/gpu/grammar_host_scan.py --tokenizer .whl/smollm2-tokenizer [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections.abc import Callable

import torch
import xgrammar as xgr
from bench_grammar import SCHEMA
from transformers import AutoTokenizer

VOCAB = 128256  # Llama-3's: the bitmask's width in bench_grammar


def timed_ms(work: Callable[[], object], repeats: int) -> float:
    work()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        samples.append(1e3 * (time.perf_counter() - start))
    return statistics.median(samples)


def walked_matchers(compiled, batch: int, seed: int) -> tuple[list, list[int]]:
    """`batch` matchers walked 20..300 tokens each, and a token each one allows next."""
    noise = torch.Generator().manual_seed(seed)
    lengths = random.Random(seed)
    mask = xgr.allocate_token_bitmask(1, VOCAB)

    def allowed_token(matcher) -> int:
        matcher.fill_next_token_bitmask(mask)
        logits = torch.rand(1, VOCAB, generator=noise)
        xgr.apply_token_bitmask_inplace(logits, mask)
        return int(logits.argmax())

    matchers, nexts = [], []
    for _ in range(batch):
        matcher = xgr.GrammarMatcher(compiled)
        for _ in range(lengths.randint(20, 300)):
            assert matcher.accept_token(allowed_token(matcher))
        matchers.append(matcher)
        nexts.append(allowed_token(matcher))
    return matchers, nexts


def server_accepts(
    tokenizer, matchers: list, nexts: list[int], threads: int, repeats: int
) -> float:
    """Median ms of one step's accepts through `XGrammarBackend.accept_tokens` on `threads`
    threads, over the walked matchers (each undone by a rollback, not timed)."""
    from radixserve.constrained.xgrammar_backend import XGrammarBackend, XGrammarMatcher

    backend = XGrammarBackend(tokenizer, VOCAB, [tokenizer.eos_token_id], threads=threads)
    grammars = [XGrammarMatcher(backend, matcher) for matcher in matchers]
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        assert all(backend.accept_tokens(grammars, nexts))
        samples.append(1e3 * (time.perf_counter() - start))
        for matcher in matchers:
            matcher.rollback(1)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    info = xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=VOCAB, stop_token_ids=[tokenizer.eos_token_id]
    )
    compiler = xgr.GrammarCompiler(info, max_threads=8, cache_enabled=False)
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    matchers, nexts = walked_matchers(compiled, args.batch, seed=0)
    bitmask = torch.full(xgr.get_bitmask_shape(args.batch, VOCAB), -1, dtype=torch.int32)
    rows = list(range(args.batch))
    report: dict = {"cpus": os.cpu_count(), "batch": args.batch, "fill_ms": {}}
    for threads in (1, 2, 4, 8, 16):
        batch = xgr.BatchGrammarMatcher(max_threads=threads)
        report["fill_ms"][f"batched_{threads}_threads"] = timed_ms(
            lambda b=batch: b.batch_fill_next_token_bitmask(matchers, bitmask, rows), args.repeats
        )
    report["fill_ms"]["one_by_one"] = timed_ms(
        lambda: [m.fill_next_token_bitmask(bitmask, i) for i, m in enumerate(matchers)],
        args.repeats,
    )
    per_row = []
    for i, matcher in enumerate(matchers):
        per_row.append(timed_ms(lambda m=matcher, i=i: m.fill_next_token_bitmask(bitmask, i), 5))
    report["fill_us_per_row"] = {
        "median": 1e3 * statistics.median(per_row),
        "max": 1e3 * max(per_row),
    }

    def accepts(batched: bool) -> float:
        """Median ms of one step's accepts (each undone by a rollback, not timed)."""
        batch = xgr.BatchGrammarMatcher(max_threads=8)
        samples = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            if batched:
                assert all(batch.batch_accept_token(matchers, nexts))
            else:
                for matcher, token in zip(matchers, nexts, strict=True):
                    assert matcher.accept_token(token)
            samples.append(1e3 * (time.perf_counter() - start))
            for matcher in matchers:
                matcher.rollback(1)
        return statistics.median(samples)

    report["accept_ms"] = {"one_by_one": accepts(False), "batched_8_threads": accepts(True)}
    for threads in (1, 2, 4, 8, 16):
        report["accept_ms"][f"server_{threads}_threads"] = server_accepts(
            tokenizer, matchers, nexts, threads, args.repeats
        )
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
