"""Constrained decoding without a model: the front end's check, the xgrammar backend over a tiny
character tokenizer, the grammar cache, and the batched sampler with grammar masks and
logit_bias (constrained rows follow their grammar, every other row samples exactly as before)."""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from char_tokenizer import make_char_tokenizer

from radixserve.catalog.constraint_kinds import validate_constraint
from radixserve.constrained.base_grammar_backend import (
    CompiledGrammar,
    GrammarBackend,
    GrammarError,
)
from radixserve.constrained.grammar_cache import GrammarCache
from radixserve.constrained.xgrammar_backend import XGrammarBackend
from radixserve.layers.sampler import Sampler
from radixserve.sampling.sampling_batch_info import SamplingBatchInfo
from radixserve.sampling.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tokenizer():
    return make_char_tokenizer()


@pytest.fixture(scope="module")
def backend(tokenizer):
    return XGrammarBackend(tokenizer, len(tokenizer), {tokenizer.eos_token_id})


def allowed(bitmask_row: torch.Tensor, vocab: int) -> set[int]:
    return {t for t in range(vocab) if (int(bitmask_row[t // 32]) >> (t % 32)) & 1}


# -- the front end's check ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "text", "problem"),
    [
        ("json_schema", '{"type": "object"}', None),
        ("json_schema", "true", None),
        ("json_schema", '{"type": "objekt"}', "not a valid JSON Schema at type"),
        ("json_schema", '{"properties": {"a": {"maxLength": -1}}}', "at properties/a/maxLength"),
        ("json_schema", "{", "not valid JSON"),
        ("json_schema", "[1, 2]", "got list"),
        ("json_schema", "  ", "must not be empty"),
        ("regex", r"[0-9]{3}-\d+", None),
        ("regex", "(ab", "not a valid regular expression"),
        ("regex", 5, "must be a string"),
        ("ebnf", 'root ::= "a" rest\nrest ::= "b"*', None),
        ("ebnf", 'start ::= "a"', "must define the rule `root`"),
    ],
)
def test_validate_constraint(kind, text, problem):
    result = validate_constraint(kind, text)
    if problem is None:
        assert result is None
    else:
        assert problem in result


def test_the_check_runs_without_torch():
    """The front end calls it through SamplingParams.verify and must not load torch."""
    code = (
        "import sys; from radixserve.sampling.sampling_params import SamplingParams; "
        'SamplingParams(json_schema=\'{"type": "string"}\').verify(10); '
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


# -- the xgrammar backend ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "text", "reason"),
    [
        ("json_schema", '{"type": "string", "minLength": 5, "maxLength": 2}', "minLength 5"),
        ("json_schema", '{"$ref": "#/$defs/missing"}', "missing"),
        ("regex", "(?=a)b", "Lookahead is not supported"),
        ("regex", r"(a)\1", "Backreference is not supported"),
        ("ebnf", "root ::= rest", 'Rule "rest" is not defined'),
        ("ebnf", 'root ::= "a" |', "Expect element"),
    ],
)
def test_what_only_the_compiler_finds_is_a_grammar_error(backend, kind, text, reason):
    with pytest.raises(GrammarError) as info:
        backend.compile(kind, text)
    message = str(info.value)
    assert reason in message
    assert not message.startswith("[") and ".cc:" not in message  # no C++ source locations


def walk(backend, tokenizer, kind: str, text: str, output: str) -> Any:
    """A fresh grammar that has accepted `output`, token by token."""
    grammar = backend.compile(kind, text).new_grammar()
    for token in tokenizer.encode(output):
        assert grammar.accept_token(token), f"{output!r} rejected at {token}"
    return grammar


def test_a_grammar_accepts_what_it_allows_and_ends_on_the_stop_token(backend, tokenizer):
    grammar = walk(backend, tokenizer, "regex", "ab+c", "abb")
    assert not grammar.accept_token(tokenizer.convert_tokens_to_ids("x"))  # refused, no change
    assert not grammar.accept_token(tokenizer.eos_token_id)  # "abb" is not a full match yet
    assert grammar.accept_token(tokenizer.convert_tokens_to_ids("c"))
    assert not grammar.is_terminated()
    assert grammar.accept_token(tokenizer.eos_token_id)
    assert grammar.is_terminated()


class Tripwire:
    """Stands in for a matcher that a fill is walking: any use fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the matcher was touched ({name}) beside a fill")


def test_a_steps_accepts_in_one_call_give_each_rows_verdict_and_end(backend, tokenizer):
    """`accept_tokens` (xgrammar's batch API) is `accept_token` per row: a refused token leaves
    its grammar as it was; each grammar's end is then known without asking its matcher (the
    scheduler checks stops while the next mask fills)."""
    ids = tokenizer.convert_tokens_to_ids
    eos = tokenizer.eos_token_id
    ending = walk(backend, tokenizer, "regex", "ab", "ab")
    refusing = walk(backend, tokenizer, "regex", "ab+c", "ab")
    going = walk(backend, tokenizer, "regex", "[0-9]+", "1")
    assert backend.accept_tokens([ending, refusing, going], [eos, ids("x"), ids("2")]) == [
        True,
        False,
        True,
    ]
    matchers = [g.matcher for g in (ending, refusing, going)]
    for grammar in (ending, refusing, going):
        grammar.matcher = Tripwire()
    assert [g.is_terminated() for g in (ending, refusing, going)] == [True, False, False]
    ending.matcher, refusing.matcher, going.matcher = matchers
    assert refusing.accept_token(ids("c")) and refusing.accept_token(eos)  # "ab" still stood
    assert refusing.is_terminated()
    refusing.rollback(1)
    assert not refusing.is_terminated()


def test_a_large_steps_accepts_split_over_threads_keep_each_rows_verdict(tokenizer, monkeypatch):
    """Past ACCEPT_SHARD_ROWS a row the accepts run in shards on the backend's threads: each
    row's verdict and grammar state are still those of accepting it alone, in row order."""
    import xgrammar as xgr

    from radixserve.constrained import xgrammar_backend

    backend = XGrammarBackend(tokenizer, len(tokenizer), {tokenizer.eos_token_id}, threads=4)
    ids = tokenizer.convert_tokens_to_ids
    cases = [
        ("[0-9]+", "1", ids("2")),
        ("ab+c", "ab", ids("x")),
        ("ab", "ab", tokenizer.eos_token_id),
    ]
    rows = [cases[(i * 7) % 3] for i in range(37)]  # 37 rows: 4 shards of 9-10
    grammars = [walk(backend, tokenizer, "regex", regex, walked) for regex, walked, _ in rows]
    alone = [walk(backend, tokenizer, "regex", regex, walked) for regex, walked, _ in rows]
    tokens = [token for _, _, token in rows]
    shards = []
    batch_accept = xgr.BatchGrammarMatcher.batch_accept_token

    def recorded(matchers, shard_tokens):
        shards.append((threading.current_thread().name, len(matchers)))
        return batch_accept(matchers, shard_tokens)

    monkeypatch.setattr(xgr.BatchGrammarMatcher, "batch_accept_token", recorded)
    verdicts = backend.accept_tokens(grammars, tokens)
    assert len(shards) == 37 // xgrammar_backend.ACCEPT_SHARD_ROWS, shards
    assert sum(n for _, n in shards) == 37 and min(n for _, n in shards) >= 8, shards
    names = {name for name, _ in shards}
    assert threading.current_thread().name in names and len(names) > 1, shards
    assert verdicts == [g.accept_token(t) for g, t in zip(alone, tokens, strict=True)]
    assert verdicts.count(False) == sum(1 for r in rows if r is cases[1])
    for grammar, twin in zip(grammars, alone, strict=True):
        assert grammar.is_terminated() == twin.is_terminated()
        assert grammar.accept_token(ids("c")) == twin.accept_token(ids("c"))


def test_a_batch_mask_constrains_only_the_constrained_rows(backend, tokenizer):
    vocab = len(tokenizer)
    digits = walk(backend, tokenizer, "regex", "[0-9]+", "12")
    literal = walk(backend, tokenizer, "json_schema", '{"enum": ["abc", "abd"]}', '"ab')
    pending = backend.start_token_bitmask([digits, literal], [1, 3], 4, pinned=False)
    mask = pending.wait(torch.device("cpu"))
    assert mask.bitmask.shape == (4, (vocab + 31) // 32)
    assert mask.rows == [1, 3]
    ids = tokenizer.convert_tokens_to_ids
    assert allowed(mask.bitmask[1], vocab) == {ids(str(d)) for d in range(10)} | {
        ids("00"),
        ids("12"),
        tokenizer.eos_token_id,
    }
    assert allowed(mask.bitmask[3], vocab) == {ids("c"), ids("d")}

    # the unconstrained rows' words are whatever the buffer held: none may reach their logits
    mask.bitmask[0].zero_()
    mask.bitmask[2].zero_()
    logits = torch.randn(4, vocab)
    expected = logits.clone()
    mask.apply(logits)
    assert torch.equal(logits[0], expected[0]) and torch.equal(logits[2], expected[2])
    for row in (1, 3):
        keep = sorted(allowed(mask.bitmask[row], vocab))
        assert torch.equal(logits[row, keep], expected[row, keep])
        banned = sorted(set(range(vocab)) - set(keep))
        assert torch.isneginf(logits[row, banned]).all()


class SlowFillBackend(GrammarBackend):
    """A fill that says when it has begun, then works until released (as native code would,
    without the GIL)."""

    def __init__(self) -> None:
        self.begun = threading.Event()
        self.release = threading.Event()

    def compile(self, kind, text):
        raise NotImplementedError

    def new_grammar(self, handle):
        raise NotImplementedError

    def fill_token_bitmask(self, grammars, rows, batch_size, pinned):
        self.begun.set()
        assert self.release.wait(timeout=30)
        return torch.full((batch_size, 1), -1, dtype=torch.int32)

    def apply_token_bitmask(self, logits, bitmask, rows):
        raise NotImplementedError


def test_the_mask_fill_has_begun_when_start_returns():
    """The scheduler's thread goes back to its Python only once the mask thread runs: else the
    fill would wait for the GIL through the emits it should run beside."""
    backend = SlowFillBackend()
    for _ in range(3):  # the first call also starts the thread; the later ones find it idle
        backend.begun.clear()
        backend.release.clear()
        pending = backend.start_token_bitmask([], [0, 2], 3, pinned=False)
        assert backend.begun.is_set()
        backend.release.set()
        mask = pending.wait(torch.device("cpu"))
        assert mask.rows == [0, 2] and mask.bitmask.shape == (3, 1)


# -- the grammar cache -------------------------------------------------------------------------


class CountingBackend:
    """Compiles regexes to themselves; JSON Schemas fail. Counts what it is asked."""

    def __init__(self) -> None:
        self.compiles: list[tuple[str, str]] = []
        self.release = threading.Event()
        self.release.set()

    def compile(self, kind: str, text: str) -> CompiledGrammar:
        self.release.wait(timeout=30)
        self.compiles.append((kind, text))
        if kind == "json_schema":
            raise GrammarError("not this one")
        return CompiledGrammar(self, text)


def test_the_cache_compiles_each_constraint_once_failures_included():
    backends: list[CountingBackend] = []
    cache = GrammarCache(lambda: backends.append(CountingBackend()) or backends[-1])
    first = cache.get("regex", "a+")
    assert cache.get("regex", "a+") is first  # while compiling or after: the same compile
    assert first.result(timeout=30).handle == "a+"
    assert cache.get("regex", "a+") is first
    bad = cache.get("json_schema", "{}")
    with pytest.raises(GrammarError, match="not this one"):
        bad.result(timeout=30)
    assert cache.get("json_schema", "{}") is bad
    assert cache.get("ebnf", "a+") is not first  # the kind is part of the key
    cache.get("ebnf", "a+").result(timeout=30)
    assert len(backends) == 1, "the backend is built once, on first use"
    assert backends[0].compiles == [("regex", "a+"), ("json_schema", "{}"), ("ebnf", "a+")]


def test_the_cache_forgets_the_least_recently_used_entry():
    backend = CountingBackend()
    cache = GrammarCache(lambda: backend, max_entries=2)
    for text in ("a", "b"):
        cache.get("regex", text).result(timeout=30)
    cache.get("regex", "a")  # used again: "b" is now the oldest
    cache.get("regex", "c").result(timeout=30)
    assert len(cache) == 2
    cache.get("regex", "a").result(timeout=30)
    cache.get("regex", "b").result(timeout=30)
    assert backend.compiles == [("regex", t) for t in ("a", "b", "c", "b")]


def test_asking_never_waits_for_a_compile():
    backend = CountingBackend()
    backend.release.clear()
    cache = GrammarCache(lambda: backend)
    future = cache.get("regex", "slow")
    assert not future.done()
    backend.release.set()
    assert future.result(timeout=30).handle == "slow"


# -- the batched sampler -----------------------------------------------------------------------


@dataclass
class FakeReq:
    sampling_params: SamplingParams
    grammar: Any = None
    origin_input_ids: list[int] = field(default_factory=lambda: [5, 6])
    output_ids: list[int] = field(default_factory=list)


def sample(reqs: list[FakeReq], logits: torch.Tensor) -> list[int]:
    info = SamplingBatchInfo.from_reqs(reqs, logits.shape[1], "cpu", {0})
    if info.has_grammars:
        info.update_grammar_mask()
    return Sampler()(logits.clone(), info).next_token_ids.tolist()


def test_unconstrained_rows_sample_exactly_as_without_the_constrained_ones(backend, tokenizer):
    vocab = len(tokenizer)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.9, top_p=0.8, seed=11),
        SamplingParams(temperature=1.3, top_k=7, seed=12, repetition_penalty=1.3),
        SamplingParams(temperature=0.0, logit_bias={3: 2.5}),
    ]
    regex = "[a-c]{2}x"
    torch.manual_seed(0)
    for step in range(8):
        logits = torch.randn(6, vocab) * 4
        grammars = [walk(backend, tokenizer, "regex", regex, "ab"[: step % 3]) for _ in range(2)]
        constrained = [
            FakeReq(SamplingParams(temperature=0.0, regex=regex), grammars[0]),
            FakeReq(SamplingParams(temperature=1.0, seed=step, regex=regex), grammars[1]),
        ]
        plain = [FakeReq(p, output_ids=[1] * step) for p in params]
        mixed = sample([plain[0], constrained[0], *plain[1:3], constrained[1], plain[3]], logits)
        alone = sample(plain, logits[[0, 2, 3, 5]])
        assert [mixed[i] for i in (0, 2, 3, 5)] == alone
        prefix = "ab"[: step % 3]
        for token in (mixed[1], mixed[4]):
            assert walk(backend, tokenizer, "regex", regex, prefix).accept_token(token)
