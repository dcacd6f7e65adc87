"""Constrained requests through the scheduling policy, with the fake worker sampling its logits
table through the real Sampler (scheduler_harness.py) and real xgrammar grammars over a tiny
character tokenizer.

The reference for every request is a plain loop: the table's logits after the last token, the
grammar's mask, the argmax, the grammar accepts it. Under overlap the scheduler launches batch
N+1 before it knows batch N's tokens; the outputs only match the reference if each mask was
built after the matchers had accepted the tokens really sampled.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field

import jsonschema
import pytest
import torch
from char_tokenizer import make_char_tokenizer
from scheduler_harness import CONTEXT, assert_memory_returned, collect, drain, make_scheduler
from scheduler_harness import Run as RunRecord

from radixserve.boundary import AbortReq, GrammarsReadyReq, TokenizedGenerateReqInput
from radixserve.constrained.base_grammar_backend import CompiledGrammar, Grammar, GrammarBackend
from radixserve.constrained.xgrammar_backend import XGrammarBackend
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.scheduler.scheduler import ServedModel

TOKENIZER = make_char_tokenizer()
EOS_ID = TOKENIZER.eos_token_id
V = len(TOKENIZER)
# the fake model: row t holds the logits after token t
TABLE = torch.randn(V, V, generator=torch.Generator().manual_seed(5)) * 3

PERSON = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "tag": {"enum": ["ab", "abc", None]},
    },
    "required": ["id", "ok"],
}
CONSTRAINTS = [
    ("regex", "[a-c]{2,4}(x|yz)"),
    ("regex", r"\d{3}-[a-z]{2}"),
    ("json_schema", json.dumps(PERSON)),
    ("json_schema", json.dumps({"type": "array", "items": {"type": "boolean"}, "maxItems": 3})),
    ("ebnf", 'root ::= "(" item ("," item)? ")"\nitem ::= [0-9] | "ab"'),
    (None, None),
]


def model(tokenizer=TOKENIZER) -> ServedModel:
    return ServedModel(
        context_len=CONTEXT, vocab_size=V, eos_token_ids=frozenset({EOS_ID}), tokenizer=tokenizer
    )


def params(kind: str | None, text: str | None, max_new_tokens: int = 40, **kw) -> SamplingParams:
    constraint = {kind: text} if kind else {}
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, **constraint, **kw)


def submit(scheduler, rid: str, prompt: list[int], sampling_params: SamplingParams) -> None:
    scheduler.dispatch(TokenizedGenerateReqInput(rid, prompt, sampling_params, stream=True))


def reference(backend: GrammarBackend, kind, text, prompt: list[int], max_new: int) -> list[int]:
    """Greedy decoding of the table, one token at a time, under the grammar."""
    grammar = backend.compile(kind, text).new_grammar() if kind else None
    out, last = [], prompt[-1]
    for _ in range(max_new):
        logits = TABLE[last].clone().unsqueeze(0)
        if grammar is not None:
            backend.start_token_bitmask([grammar], [0], 1, False).wait(logits.device).apply(logits)
        last = int(logits.argmax())
        out.append(last)
        if grammar is not None:
            assert grammar.accept_token(last)
            if grammar.is_terminated():
                break
        elif last == EOS_ID:
            break
    return out


def assert_follows(kind: str, text: str, output: list[int]) -> None:
    assert output[-1] == EOS_ID, "a finished grammar ends on the stop token"
    decoded = TOKENIZER.decode(output[:-1])
    if kind == "regex":
        assert re.fullmatch(text, decoded), decoded
    elif kind == "json_schema":
        jsonschema.validate(json.loads(decoded), json.loads(text))


@pytest.fixture(scope="module")
def backend() -> GrammarBackend:
    return XGrammarBackend(TOKENIZER, V, {EOS_ID})


def prompts(n: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(1, V, (int(5 + 7 * (i % 4)),), generator=gen).tolist() for i in range(n)]


@pytest.mark.parametrize(
    "setup",
    [
        {"asynchronous": False},
        {"asynchronous": True},
        {"asynchronous": True, "chunked_prefill_size": 8, "max_prefill_tokens": 16},
        {"asynchronous": True, "enable_mixed_chunk": True, "chunked_prefill_size": 16},
        {"asynchronous": True, "max_total_tokens": 160, "max_running_requests": 8},
    ],
    ids=["sync", "overlap", "overlap-chunked", "overlap-mixed", "overlap-retract"],
)
def test_outputs_follow_the_tokens_really_sampled(backend, setup):
    setup = dict(setup)
    scheduler = make_scheduler(model=model(), logits_table=TABLE, **setup)
    assert scheduler.overlap == setup["asynchronous"]
    work = {}
    for i, ids in enumerate(prompts(18)):
        kind, text = CONSTRAINTS[i % len(CONSTRAINTS)]
        work[f"r{i}"] = (kind, text, ids)
        submit(scheduler, f"r{i}", ids, params(kind, text))
        if setup.get("enable_mixed_chunk"):
            scheduler.step()  # arrivals while others decode: mixed passes
    run = drain(scheduler)
    for rid, (kind, text, ids) in work.items():
        assert run.outputs[rid] == reference(backend, kind, text, ids, 40), rid
        if kind is not None:
            assert run.finish[rid]["type"] == "stop", (rid, run.finish[rid])
            assert_follows(kind, text, run.outputs[rid])
    assert scheduler.worker.masks_filled > 0
    # each fill began while the batch before was resolved, not when the sampling needed it
    assert scheduler.worker.masks_filled_late == 0
    info = scheduler.get_server_info()
    if "max_total_tokens" in setup:
        assert info["num_retractions"] > 0
    if setup.get("enable_mixed_chunk"):
        assert info["forward_steps_by_mode"]["mixed"] > 0
    assert_memory_returned(scheduler)


def test_a_batch_without_constrained_rows_samples_at_launch():
    scheduler = make_scheduler(model=model(), logits_table=TABLE, asynchronous=True)
    for i, ids in enumerate(prompts(3)):
        submit(scheduler, f"p{i}", ids, params(None, None, 8))
    drain(scheduler)
    assert scheduler.worker.masks_filled == 0


def test_max_new_tokens_ends_a_grammar_early_and_ignore_eos_does_not_outlive_it(backend):
    scheduler = make_scheduler(model=model(), logits_table=TABLE, asynchronous=True)
    ids = prompts(1)[0]
    kind, text = CONSTRAINTS[2]
    submit(scheduler, "short", ids, params(kind, text, max_new_tokens=4))
    submit(scheduler, "eos", ids, params(kind, text, ignore_eos=True))
    run = drain(scheduler)
    full = reference(backend, kind, text, ids, 40)
    assert run.finish["short"] == {"type": "length"} and run.outputs["short"] == full[:4]
    assert run.finish["eos"]["type"] == "stop" and run.outputs["eos"] == full


class GatedBackend(GrammarBackend):
    """Compiles like `inner`, once `gate` is set."""

    def __init__(self, inner: GrammarBackend, gate: threading.Event) -> None:
        self.inner, self.gate = inner, gate

    def compile(self, kind, text):
        assert self.gate.wait(timeout=60)
        return self.inner.compile(kind, text)  # its grammars and masks are inner's

    def new_grammar(self, handle):
        return self.inner.new_grammar(handle)

    def fill_token_bitmask(self, grammars, rows, batch_size, pinned):
        return self.inner.fill_token_bitmask(grammars, rows, batch_size, pinned)

    def apply_token_bitmask(self, logits, bitmask, rows):
        self.inner.apply_token_bitmask(logits, bitmask, rows)


@dataclass(frozen=True)
class GatedModel(ServedModel):
    gate: threading.Event = field(default_factory=threading.Event, compare=False)

    def grammar_backend(self) -> GrammarBackend:
        return GatedBackend(super().grammar_backend(), self.gate)


def gated_model() -> GatedModel:
    return GatedModel(CONTEXT, V, frozenset({EOS_ID}), TOKENIZER)


def test_a_request_waits_for_its_grammar_and_the_loop_goes_on(backend):
    served = gated_model()
    scheduler = make_scheduler(model=served, logits_table=TABLE, asynchronous=True)
    ids = prompts(2)
    kind, text = CONSTRAINTS[0]
    submit(scheduler, "constrained", ids[0], params(kind, text))
    submit(scheduler, "plain", ids[1], params(None, None, 12))
    run = drain_until(scheduler, lambda: not scheduler._has_runnable_work())
    assert run.finish["plain"]["type"] == "length"
    assert [r.rid for r in scheduler.grammar_queue] == ["constrained"]
    assert "constrained" not in run.outputs
    assert not any(b.sampling_info.has_grammars for b in scheduler.worker.batches)
    assert scheduler.has_work() and scheduler.waiting_only_in_background()
    assert not scheduler.step()
    assert scheduler.get_server_info()["num_compiling_grammars"] == 1
    served.gate.set()
    run = drain(scheduler, run)
    assert run.outputs["constrained"] == reference(backend, kind, text, ids[0], 40)
    assert_memory_returned(scheduler)


class GuardedGrammar(Grammar):
    """A matcher that fails the test when it accepts a token while its backend fills a mask;
    its end, as the contract asks, is read from what its accepts recorded (the scheduler's stop
    checks run beside the fill)."""

    def __init__(self, backend: GuardedBackend, inner: Grammar) -> None:
        super().__init__(backend)
        self.inner = inner
        self.terminated = False

    def accept_token(self, token_id: int) -> bool:
        assert not self.backend.filling.is_set(), "a matcher accepted a token during a fill"
        accepted = self.inner.accept_token(token_id)
        self.terminated = self.inner.is_terminated()
        return accepted

    def is_terminated(self) -> bool:
        return self.terminated


class GuardedBackend(GrammarBackend):
    """`inner`'s grammars and masks, with each fill held open long enough for the scheduler's
    thread to go on beside it."""

    def __init__(self, inner: GrammarBackend) -> None:
        self.inner = inner
        self.filling = threading.Event()
        self.fills = 0

    def compile(self, kind, text):
        return CompiledGrammar(self, self.inner.compile(kind, text).handle)

    def new_grammar(self, handle):
        return GuardedGrammar(self, self.inner.new_grammar(handle))

    def fill_token_bitmask(self, grammars, rows, batch_size, pinned):
        self.filling.set()
        try:
            time.sleep(0.002)
            inner = [g.inner for g in grammars]
            return self.inner.fill_token_bitmask(inner, rows, batch_size, pinned)
        finally:
            self.fills += 1
            self.filling.clear()

    def apply_token_bitmask(self, logits, bitmask, rows):
        self.inner.apply_token_bitmask(logits, bitmask, rows)


@dataclass(frozen=True)
class GuardedModel(ServedModel):
    backends: list = field(default_factory=list, compare=False)

    def grammar_backend(self) -> GrammarBackend:
        self.backends.append(GuardedBackend(super().grammar_backend()))
        return self.backends[-1]


def test_no_matcher_is_touched_while_a_mask_fills(backend):
    """The fill runs on the mask thread while the scheduler's thread appends, checks and emits
    the batch before: that thread must accept no token until the fill is done (a fill walks the
    parser ahead and back)."""
    served = GuardedModel(CONTEXT, V, frozenset({EOS_ID}), TOKENIZER)
    scheduler = make_scheduler(model=served, logits_table=TABLE, asynchronous=True)
    work = {}
    for i, ids in enumerate(prompts(12)):
        kind, text = CONSTRAINTS[i % len(CONSTRAINTS)]
        work[f"r{i}"] = (kind, text, ids)
        submit(scheduler, f"r{i}", ids, params(kind, text))
    run = drain(scheduler)
    assert served.backends[0].fills > 10
    for rid, (kind, text, ids) in work.items():
        assert run.outputs[rid] == reference(backend, kind, text, ids, 40), rid


def drain_until(scheduler, done, max_steps: int = 2000) -> RunRecord:
    run = RunRecord(scheduler, scheduler.worker, {}, {}, {})
    for _ in range(max_steps):
        scheduler.step()
        collect(scheduler, run)
        if done():
            return run
    raise AssertionError("never got there")


@pytest.mark.parametrize(
    ("kind", "text", "reason"),
    [
        ("json_schema", '{"type": "string", "minLength": 3, "maxLength": 1}', "minLength 3"),
        ("regex", "(?!a)b", "Lookahead"),
        ("ebnf", "root ::= item", '"item" is not defined'),
    ],
)
def test_a_constraint_that_does_not_compile_ends_the_request_before_admission(kind, text, reason):
    scheduler = make_scheduler(model=model(), logits_table=TABLE, asynchronous=True)
    ids = prompts(2)
    submit(scheduler, "bad", ids[0], params(kind, text))
    submit(scheduler, "good", ids[1], params(*CONSTRAINTS[1]))
    run = drain(scheduler)
    assert run.finish["bad"]["type"] == "error" and run.finish["bad"]["param"] == kind
    assert run.finish["bad"]["message"].startswith(f"{kind} cannot be compiled: ")
    assert reason in run.finish["bad"]["message"]
    assert run.outputs.get("bad", []) == []
    assert all(len(b.seq_lens) == 1 for b in scheduler.worker.batches), "only 'good' ran"
    assert run.finish["good"]["type"] == "stop"
    assert_memory_returned(scheduler)


def test_a_model_without_a_tokenizer_refuses_constraints_by_name():
    scheduler = make_scheduler(model=model(tokenizer=None), logits_table=TABLE)
    submit(scheduler, "r", prompts(1)[0], params(*CONSTRAINTS[0]))
    (out,) = scheduler.pop_outputs()
    assert out.finished_reason["type"] == "error" and out.finished_reason["param"] == "regex"
    assert "tokenizer" in out.finished_reason["message"]
    assert not scheduler.has_work()


def test_abort_while_the_grammar_compiles():
    served = gated_model()
    scheduler = make_scheduler(model=served, logits_table=TABLE)
    submit(scheduler, "r", prompts(1)[0], params(*CONSTRAINTS[2]))
    scheduler.step()
    scheduler.dispatch(AbortReq("r"))
    (out,) = scheduler.pop_outputs()
    assert out.finished_reason == {"type": "abort"}
    served.gate.set()
    assert not scheduler.has_work() and not scheduler.step()


def test_with_ranks_a_grammar_is_admitted_when_rank_0_says_so(backend):
    scheduler = make_scheduler(model=model(), logits_table=TABLE)
    scheduler.polls_grammars = False  # what --tp-size > 1 sets: rank 0's loop decides
    ids = prompts(1)[0]
    kind, text = CONSTRAINTS[4]
    submit(scheduler, "r", ids, params(kind, text))
    scheduler.grammar_queue[0].grammar_future.result(timeout=60)
    for _ in range(3):
        assert not scheduler.step()  # compiled, but nobody said so
    assert scheduler.ready_grammar_rids() == ["r"]
    scheduler.dispatch(GrammarsReadyReq(["r"]))
    assert not scheduler.grammar_queue
    run = drain(scheduler)
    assert run.outputs["r"] == reference(backend, kind, text, ids, 40)


class RefusingBackend(GuardedBackend):
    """`inner`'s grammars, whose batched accepts refuse the `refuse_at`-th call's first token
    (as a mask that let through a token its grammar refuses would make them)."""

    def __init__(self, inner: GrammarBackend, refuse_at: int) -> None:
        super().__init__(inner)
        self.calls = 0
        self.refuse_at = refuse_at

    def accept_tokens(self, grammars, tokens):
        self.calls += 1
        verdicts = super().accept_tokens(grammars, tokens)
        if self.calls == self.refuse_at:
            grammars[0].inner.rollback(1)  # as if refused: its state as it was
            verdicts[0] = False
        return verdicts


@dataclass(frozen=True)
class RefusingModel(ServedModel):
    def grammar_backend(self) -> GrammarBackend:
        return RefusingBackend(super().grammar_backend(), refuse_at=3)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "overlap"])
def test_a_token_refused_in_the_batched_accepts_ends_only_its_request(backend, asynchronous):
    """A token the grammar refuses is an engine error for that request alone, whether its
    verdict came from the step's batched accepts; the other rows go on as they would."""
    served = RefusingModel(CONTEXT, V, frozenset({EOS_ID}), TOKENIZER)
    scheduler = make_scheduler(model=served, logits_table=TABLE, asynchronous=asynchronous)
    kind, text = CONSTRAINTS[2]
    ids = prompts(2)
    submit(scheduler, "refused", ids[0], params(kind, text))
    submit(scheduler, "other", ids[1], params(kind, text))
    run = drain(scheduler)
    assert run.finish["refused"] == {"type": "error", "message": "the grammar rejected a token"}
    assert run.outputs["other"] == reference(backend, kind, text, ids[1], 40)
    assert_memory_returned(scheduler)
