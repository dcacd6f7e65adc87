"""The grammar backend on xgrammar: compiled grammars with precomputed token masks, a matcher per
request, batched bitmask fills on the host and the bitmask applied by xgrammar's kernel (Triton
on CUDA, C++ on the CPU).

JSON Schemas compile to compact JSON (`{"a": 1, "b": [2, 3]}`): no free whitespace between
tokens, so a model cannot stall in a run of newlines, and properties must appear in the schema's
order with no extra ones (xgrammar's strict mode; the output still validates against the schema).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import transformers
import xgrammar as xgr

from radixserve.constrained.base_grammar_backend import (
    CompiledGrammar,
    Grammar,
    GrammarBackend,
    GrammarError,
)

# xgrammar's messages start with a timestamp, the C++ source line and sometimes the failed check
_MESSAGE_PREFIX = re.compile(r"^\[[\d:.]+\] \S+:\d+: (Check failed: .*? is false: )?")
# Rows a thread takes of a step's accepts at the least: xgrammar's batch accept runs its rows
# one after the other on the calling thread (with the GIL released), ~15-40 us a row of a JSON
# Schema, so a step's accepts are split over the backend's threads; under this many rows a
# thread's hand-off costs more than its share saves.
ACCEPT_SHARD_ROWS = 8


def _reason(exc: Exception) -> str:
    return _MESSAGE_PREFIX.sub("", str(exc).strip()).strip()


def _compile(compiler: xgr.GrammarCompiler, kind: str, text: str) -> xgr.CompiledGrammar:
    try:
        if kind == "json_schema":
            return compiler.compile_json_schema(text, any_whitespace=False)
        if kind == "regex":
            return compiler.compile_regex(text)
        if kind == "ebnf":
            return compiler.compile_grammar(text)
    except RuntimeError as exc:
        raise GrammarError(_reason(exc)) from None
    raise ValueError(f"unknown constraint kind {kind!r}")


@dataclass(frozen=True)
class XGrammarRecipe:
    """What a compile worker process needs (compile_worker.py): the vocabulary as xgrammar
    serializes it. The worker sends back the compiled grammar's JSON, which the backend loads
    against its own vocabulary."""

    tokenizer_info_json: str
    threads: int

    def build(self) -> Callable[[str, str], tuple[Callable[[], str], int]]:
        info = xgr.TokenizerInfo.deserialize_json(self.tokenizer_info_json)
        compiler = xgr.GrammarCompiler(info, max_threads=self.threads, cache_enabled=False)

        def compile_one(kind: str, text: str) -> tuple[Callable[[], str], int]:
            compiled = _compile(compiler, kind, text)
            # JSON of the token mask cache: ~2x the compile's time for a big enum
            return compiled.serialize_json, compiled.memory_size_bytes

        return compile_one


class XGrammarMatcher(Grammar):
    def __init__(self, backend: XGrammarBackend, matcher: xgr.GrammarMatcher) -> None:
        super().__init__(backend)
        self.matcher = matcher
        # the matcher's is_terminated as of its last accept or rollback (only they change it):
        # read beside a mask fill, which must be the only one touching the matcher
        self.terminated = matcher.is_terminated()

    def accept_token(self, token_id: int) -> bool:
        accepted = self.matcher.accept_token(token_id)
        if accepted:
            self.terminated = self.matcher.is_terminated()
        return accepted

    def is_terminated(self) -> bool:
        return self.terminated

    can_rollback = True  # xgrammar keeps every step (max_rollback_tokens -1: unbounded)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self.matcher.rollback(num_tokens)
            self.terminated = self.matcher.is_terminated()


class XGrammarBackend(GrammarBackend):
    """One model's vocabulary as xgrammar sees it. Building it reads the whole vocabulary (about
    a second for 128k tokens), so the grammar cache builds it on its thread at the first
    constrained request."""

    def __init__(
        self,
        tokenizer: transformers.PreTrainedTokenizerBase,
        vocab_size: int,
        stop_token_ids: Collection[int],
        threads: int | None = None,
    ) -> None:
        """`threads`: for the compiles, the fills and the accepts; None: the CPUs this process
        may run on, up to 16."""
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_token_ids) or None
        )
        # the fill's cost is a step's host time: 64 rows of a 128k vocabulary take ~9 ms on one
        # thread, ~1.7 ms on 16 (H200 host, benchmark-log.md); more gain little
        if threads is None:
            threads = min(16, len(os.sched_getaffinity(0)))
        # the grammar cache owns caching (keyed by kind and text, failures included)
        self._info = info
        self._threads = threads
        self._compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
        self._batch = xgr.BatchGrammarMatcher(max_threads=threads)
        # the accepts' other shards (the calling thread takes the first): see ACCEPT_SHARD_ROWS
        self._accept_pool = (
            ThreadPoolExecutor(threads - 1, thread_name_prefix="grammar-accept")
            if threads > 1
            else None
        )
        self.vocab_size = vocab_size

    def compile(self, kind: str, text: str) -> CompiledGrammar:
        handle = _compile(self._compiler, kind, text)
        return CompiledGrammar(self, handle, handle.memory_size_bytes)

    def compile_recipe(self) -> XGrammarRecipe:
        return XGrammarRecipe(self._info.serialize_json(), self._threads)

    def load_compiled(self, payload: str, nbytes: int) -> CompiledGrammar:
        # about a tenth of the compile's time; xgrammar releases the GIL meanwhile
        handle = xgr.CompiledGrammar.deserialize_json(payload, self._info)
        return CompiledGrammar(self, handle, nbytes)

    def new_grammar(self, handle: Any) -> XGrammarMatcher:
        return XGrammarMatcher(self, xgr.GrammarMatcher(handle))

    def accept_tokens(self, grammars: Sequence[Grammar], tokens: Sequence[int]) -> list[bool]:
        """Each row's verdict, in order. The rows are split into shards of at least
        ACCEPT_SHARD_ROWS, one a thread (the calling thread takes the first), since xgrammar's
        batch accept walks its rows one by one: at batch 64 on the H200 host that was 2.0-2.5 ms
        of the step's host time on one thread (bench_grammar.py, 2026-12-04)."""
        matchers = [g.matcher for g in grammars]
        tokens = list(tokens)
        accept = xgr.BatchGrammarMatcher.batch_accept_token
        shards = min(self._threads, len(matchers) // ACCEPT_SHARD_ROWS)
        if shards <= 1 or self._accept_pool is None:
            accepted = accept(matchers, tokens)
        else:
            bounds = [len(matchers) * i // shards for i in range(shards + 1)]
            others = [
                self._accept_pool.submit(accept, matchers[a:b], tokens[a:b])
                for a, b in zip(bounds[1:-1], bounds[2:], strict=True)
            ]
            accepted = accept(matchers[: bounds[1]], tokens[: bounds[1]])
            for shard in others:
                accepted += shard.result()
        for grammar, ok in zip(grammars, accepted, strict=True):
            if ok:
                grammar.terminated = grammar.matcher.is_terminated()
        return accepted

    def fill_token_bitmask(
        self, grammars: Sequence[Grammar], rows: Sequence[int], batch_size: int, pinned: bool
    ) -> torch.Tensor:
        # left uninitialised: every constrained row is written whole, and only those are read
        host = torch.empty(
            xgr.get_bitmask_shape(batch_size, self.vocab_size),
            dtype=xgr.bitmask_dtype,
            pin_memory=pinned,
        )
        matchers = [g.matcher for g in grammars]
        self._batch.batch_fill_next_token_bitmask(matchers, host, list(rows))
        return host

    def apply_token_bitmask(
        self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]
    ) -> None:
        xgr.apply_token_bitmask_inplace(logits, bitmask, indices=rows)
