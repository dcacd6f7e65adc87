"""The grammar cache's limits, through the scheduling policy (scheduler_harness.py's fake worker,
real xgrammar grammars over the tiny character tokenizer): a compile that never ends delays
neither an unconstrained request nor a simple constrained one, runs into the time limit (a 400
naming the constraint), is cancelled when its last request is aborted, and the cache is bounded
by bytes as well as by count.

Compiles run in worker processes (the xgrammar backend's compile recipe), where a stopped
compile is killed, or, for a backend without a recipe, on threads, where it is abandoned: most
tests run both ways. A constraint whose text holds SLOW never finishes compiling.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pytest
from scheduler_harness import Run as RunRecord
from scheduler_harness import collect, drain
from slow_grammar import SLOW, SLOW_TO_SERIALIZE, BrokenRecipe, SlowRecipe
from test_scheduler_grammar import CONSTRAINTS, EOS_ID, TABLE, TOKENIZER, V, params, prompts

from radixserve.boundary import AbortReq, GrammarsReadyReq, TokenizedGenerateReqInput
from radixserve.constrained.base_grammar_backend import CompiledGrammar, GrammarError
from radixserve.constrained.grammar_cache import GrammarCache
from radixserve.constrained.xgrammar_backend import XGrammarBackend
from radixserve.scheduler.scheduler import ServedModel

SLOW_SCHEMA = json.dumps({"type": "string", "description": SLOW})
SIMPLE = CONSTRAINTS[3]  # a short array of booleans: compiles in milliseconds, ends soon
# thread path: the slow compiles end when this is set (at the end of each test)
RELEASE = threading.Event()


class SlowBackend(XGrammarBackend):
    in_process = False

    def compile(self, kind, text):
        if SLOW in text:
            RELEASE.wait(600)
            raise GrammarError("released")
        return super().compile(kind, text)

    def compile_recipe(self):
        return None if self.in_process else SlowRecipe(super().compile_recipe())


@dataclass(frozen=True)
class SlowModel(ServedModel):
    in_process: bool = False

    def grammar_backend(self) -> SlowBackend:
        backend = SlowBackend(self.tokenizer, self.vocab_size, self.eos_token_ids)
        backend.in_process = self.in_process
        return backend


@pytest.fixture(autouse=True)
def release_slow_threads():
    RELEASE.clear()
    yield
    RELEASE.set()


@pytest.fixture(params=["process", "thread"])
def where(request) -> str:
    return request.param


def make(where: str, **server_args):
    from scheduler_harness import make_scheduler

    served = SlowModel(512, V, frozenset({EOS_ID}), TOKENIZER, in_process=where == "thread")
    scheduler = make_scheduler(model=served, logits_table=TABLE, **server_args)
    return scheduler


def submit(scheduler, rid: str, kind: str | None, text: str | None, max_new: int = 40) -> None:
    ids = prompts(1)[0]
    request = TokenizedGenerateReqInput(rid, ids, params(kind, text, max_new), stream=True)
    scheduler.dispatch(request)


def step_until(scheduler, run: RunRecord, done, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "never got there"
        if scheduler.waiting_only_in_background():
            scheduler.wait_in_background(timeout=0.05)
        scheduler.step()
        collect(scheduler, run)


def eventually(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "never got there"
        time.sleep(0.01)


def worker_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead too: multiprocessing reaps killed workers at once, so this is rare
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[1][0] != "Z"


def test_a_compile_that_never_ends_delays_neither_plain_nor_simple_requests(where):
    scheduler = make(where)
    cache = scheduler.grammar_cache
    submit(scheduler, "slow", "json_schema", SLOW_SCHEMA)
    submit(scheduler, "plain", None, None, 8)
    submit(scheduler, "simple", *SIMPLE)
    run = RunRecord(scheduler, scheduler.worker, {}, {}, {})
    scheduler.step()
    collect(scheduler, run)
    assert len(run.outputs["plain"]) == 1, "the unconstrained request ran in the next step"
    # the simple one waits for its own compile only
    step_until(scheduler, run, lambda: "simple" in run.finish)
    assert run.finish["simple"]["type"] == "stop"
    json.loads(TOKENIZER.decode(run.outputs["simple"][:-1]))
    step_until(scheduler, run, lambda: "plain" in run.finish)
    assert [r.rid for r in scheduler.grammar_queue] == ["slow"]
    assert cache.stats()["grammar_compiles_running"] == 1
    scheduler.dispatch(AbortReq("slow"))
    run = drain(scheduler, run)
    assert run.finish["slow"] == {"type": "abort"}
    eventually(lambda: cache.stats()["grammar_compiles_running"] == 0)


@pytest.mark.parametrize("kind", ["json_schema", "regex"])
def test_a_compile_past_the_time_limit_is_a_400_naming_the_constraint(where, kind):
    scheduler = make(where, grammar_compile_timeout=0.5)
    cache = scheduler.grammar_cache
    text = SLOW_SCHEMA if kind == "json_schema" else f"({SLOW})+"
    submit(scheduler, "slow", kind, text)
    start = time.monotonic()
    run = drain(scheduler)
    assert time.monotonic() - start < 30
    assert run.finish["slow"] == {
        "type": "error",
        "message": f"{kind} cannot be compiled: the grammar took longer than 0.5 s to compile",
        "param": kind,
    }
    assert run.outputs.get("slow", []) == []
    stats = cache.stats()
    assert stats["grammar_compiles_timed_out"] == 1
    assert stats["grammar_compiles_running"] == 0
    if where == "process":
        assert cache.killed == 1 and not cache.compiling_pids()
    else:
        assert stats["grammar_compiles_abandoned"] == 1
    # remembered like any failure: asked again, it fails at once, without a second compile
    submit(scheduler, "again", kind, text)
    run = drain(scheduler)
    assert run.finish["again"]["param"] == kind
    assert cache.stats()["grammar_compiles_timed_out"] == 1
    # and the next constraint compiles as usual
    submit(scheduler, "simple", *SIMPLE)
    assert drain(scheduler).finish["simple"]["type"] == "stop"


def test_the_time_limit_is_the_compiles_not_the_serializations():
    """A worker announces a finished compile before it serializes the grammar (which can take
    twice as long): only the compile counts against the limit."""
    scheduler = make("process", grammar_compile_timeout=0.5)
    submit(scheduler, "r", "regex", SLOW_TO_SERIALIZE)
    run = drain(scheduler)
    assert run.finish["r"]["type"] == "stop", run.finish["r"]
    assert TOKENIZER.decode(run.outputs["r"][:-1]) == SLOW_TO_SERIALIZE
    assert scheduler.grammar_cache.stats()["grammar_compiles_timed_out"] == 0


def test_an_abort_cancels_a_compile_only_when_nobody_else_waits_for_it(where):
    scheduler = make(where)
    cache = scheduler.grammar_cache
    submit(scheduler, "a", "json_schema", SLOW_SCHEMA)
    submit(scheduler, "b", "json_schema", SLOW_SCHEMA)  # shares a's compile
    assert cache.stats()["grammar_compiles_running"] == 1
    pids: list[int] = []
    if where == "process":
        deadline = time.monotonic() + 60
        while not (pids := cache.compiling_pids()):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert all(worker_alive(p) for p in pids)
    scheduler.dispatch(AbortReq("a"))
    (out,) = scheduler.pop_outputs()
    assert out.rid == "a" and out.finished_reason == {"type": "abort"}
    time.sleep(0.2)
    assert cache.stats()["grammar_compiles_running"] == 1, "b still waits for it"
    assert all(worker_alive(p) for p in pids)
    scheduler.dispatch(AbortReq("b"))
    deadline = time.monotonic() + 10
    while cache.stats()["grammar_compiles_running"]:
        assert time.monotonic() < deadline, "the compile was not stopped"
        time.sleep(0.01)
    stats = cache.stats()
    assert stats["grammar_compiles_cancelled"] == 1
    assert len(cache) == 0, "a cancelled compile is not remembered"
    if where == "process":
        assert cache.killed == 1
        assert not any(worker_alive(p) for p in pids), "the compile's process was killed"
    else:
        assert stats["grammar_compiles_abandoned"] == 1
    assert not scheduler.has_work()
    # asked again, the constraint compiles anew (and is stopped again on abort)
    submit(scheduler, "c", "json_schema", SLOW_SCHEMA)
    assert cache.stats()["grammar_compiles_running"] == 1
    scheduler.dispatch(AbortReq("c"))


def test_compiles_in_flight_are_bounded_and_their_requests_count_as_queued():
    scheduler = make("process", max_concurrent_grammar_compiles=2)
    cache = scheduler.grammar_cache
    for i in range(3):
        submit(scheduler, f"slow{i}", "regex", f"{SLOW}{i}")
    submit(scheduler, "simple", *SIMPLE)
    stats = cache.stats()
    assert stats["grammar_compiles_running"] == 2 and stats["grammar_compiles_queued"] == 2
    info = scheduler.get_server_info()
    assert info["num_queued_requests"] == 4 and info["num_compiling_grammars"] == 4
    # one of the two running compiles is given up: the next in line starts
    scheduler.dispatch(AbortReq("slow0"))
    eventually(lambda: cache.stats()["grammar_compiles_queued"] == 1)
    assert cache.stats()["grammar_compiles_running"] == 2
    scheduler.dispatch(AbortReq("slow1"))  # "simple" now compiles, and runs
    run = RunRecord(scheduler, scheduler.worker, {}, {}, {})
    step_until(scheduler, run, lambda: "simple" in run.finish)
    assert run.finish["simple"]["type"] == "stop"
    scheduler.dispatch(AbortReq("slow2"))
    drain(scheduler)
    eventually(lambda: cache.stats()["grammar_compiles_running"] == 0)
    assert cache.stats()["grammar_compiles_cancelled"] == 3


# -- the byte bound ----------------------------------------------------------------------------


class SizedBackend:
    """Compiles a regex to itself, reporting its text's length times 100 as its size."""

    def __init__(self) -> None:
        self.compiles: list[str] = []

    def compile(self, kind: str, text: str) -> CompiledGrammar:
        self.compiles.append(text)
        return CompiledGrammar(self, text, 100 * len(text))


def test_the_cache_is_bounded_by_bytes_least_recently_used_first():
    backend = SizedBackend()
    cache = GrammarCache(lambda: backend, max_bytes=1000, processes=False)
    for text in ("aaaa", "bbbb"):  # 400 bytes each
        cache.get("regex", text).result(timeout=30)
    assert cache.nbytes == 800 and len(cache) == 2
    cache.get("regex", "aaaa")  # used again: "bbbb" is now the oldest
    cache.get("regex", "cc").result(timeout=30)  # 1000 bytes in all: still within
    assert cache.nbytes == 1000 and len(cache) == 3
    cache.get("regex", "ddd").result(timeout=30)  # 1300: "bbbb" leaves
    assert cache.nbytes == 900 and len(cache) == 3
    cache.get("regex", "aaaa").result(timeout=30)  # still there
    cache.get("regex", "bbbb").result(timeout=30)  # compiled again; "cc" and "ddd" leave
    assert backend.compiles == ["aaaa", "bbbb", "cc", "ddd", "bbbb"]
    assert cache.nbytes == 800 and len(cache) == 2
    # a grammar bigger than the whole budget is handed to its requests, not kept
    assert cache.get("regex", "x" * 11).result(timeout=30).handle == "x" * 11
    assert cache.nbytes <= 1000 and ("regex", "x" * 11) not in cache._entries


def test_the_server_reports_compiled_grammars_bytes():
    scheduler = make("process")
    for i, (kind, text) in enumerate(CONSTRAINTS[:3]):
        submit(scheduler, f"r{i}", kind, text, 4)
    drain(scheduler)
    info = scheduler.get_server_info()
    assert info["grammar_cache_entries"] == 3
    # xgrammar's own figure, carried over from the worker processes
    backend = XGrammarBackend(TOKENIZER, V, {EOS_ID})
    expected = sum(backend.compile(k, t).nbytes for k, t in CONSTRAINTS[:3])
    assert info["grammar_cache_bytes"] == expected > 0


def test_with_ranks_every_rank_takes_rank_0s_verdict_on_a_compile(where):
    """A time limit is not deterministic: rank 0's compile may run out while another rank's
    finishes. Rank 0 passes its failures on in GrammarsReadyReq; the other ranks (no limit of
    their own) finish those requests alike and drop their own compiles."""
    first = make(where, grammar_compile_timeout=0.3)
    first.polls_grammars = False  # what --tp-size > 1 sets
    submit(first, "slow", "json_schema", SLOW_SCHEMA)
    submit(first, "simple", *SIMPLE)
    eventually(lambda: sorted(first.ready_grammar_rids()) == ["simple", "slow"])
    ready = first.ready_grammar_rids()
    failed = first.grammar_failures(ready)
    assert list(failed) == ["slow"] and "longer than 0.3 s" in failed["slow"]["message"]

    peer = make(where)
    peer.polls_grammars = False
    peer.grammar_cache.timeout = None  # what scheduler_process sets on ranks 1..N-1
    submit(peer, "slow", "json_schema", SLOW_SCHEMA)
    submit(peer, "simple", *SIMPLE)
    for rank in (first, peer):
        rank.dispatch(GrammarsReadyReq(ready, failed))
        (out,) = rank.pop_outputs()
        assert out.rid == "slow" and out.finished_reason == failed["slow"]
        assert [r.rid for r in rank.waiting_queue] == ["simple"]
    eventually(lambda: peer.grammar_cache.stats()["grammar_compiles_running"] == 0)
    assert peer.grammar_cache.stats()["grammar_compiles_cancelled"] == 1
    assert drain(peer).finish["simple"]["type"] == "stop"


WORKER_OWNER = """
import sys, time
from char_tokenizer import make_char_tokenizer
from slow_grammar import SLOW, SlowRecipe
from radixserve.constrained.grammar_cache import GrammarCache
from radixserve.constrained.xgrammar_backend import XGrammarBackend

class Backend(XGrammarBackend):
    def compile_recipe(self):
        return SlowRecipe(super().compile_recipe())

tok = make_char_tokenizer()
cache = GrammarCache(lambda: Backend(tok, len(tok), {tok.eos_token_id}))
cache.get("regex", SLOW)
while not cache.compiling_pids():
    time.sleep(0.01)
print(cache.compiling_pids()[0], flush=True)
time.sleep(600)
"""


def test_a_compile_worker_ends_with_the_scheduler_even_mid_compile():
    """A scheduler killed outright leaves no compile running: its worker's parent is the fork
    server, which a live worker keeps alive, so the worker watches the scheduler itself."""
    env = {**os.environ, "PYTHONPATH": os.path.dirname(__file__)}
    owner = subprocess.Popen(
        [sys.executable, "-c", WORKER_OWNER], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        pid = int(owner.stdout.readline())
        assert worker_alive(pid)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=30)
        eventually(lambda: not worker_alive(pid))
    finally:
        owner.kill()
        owner.wait(timeout=30)


class NoWorkerBackend(XGrammarBackend):
    def compile_recipe(self):
        return BrokenRecipe()


def test_without_worker_processes_grammars_compile_on_threads(caplog):
    backend = NoWorkerBackend(TOKENIZER, V, {EOS_ID})
    cache = GrammarCache(lambda: backend)
    assert cache.get("regex", "a+b").result(timeout=60).nbytes > 0
    assert "compile on threads from now on" in caplog.text
    assert cache.get("regex", "c+").result(timeout=60).nbytes > 0
    assert caplog.text.count("compile on threads from now on") == 1
