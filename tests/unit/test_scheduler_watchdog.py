"""The hang watchdog of the scheduler process, driven with a fake clock; the loop that feeds it
and leaves, mid-generation, once its parent is gone; and the front end's /health verdict on a
scheduler that has gone silent with requests pending."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
from types import SimpleNamespace

import zmq

from radixserve.frontend.http_server import hang_problem
from radixserve.scheduler import scheduler_process
from radixserve.scheduler.scheduler_process import WATCHDOG_EXIT_CODE, Watchdog, _dump_all_stacks
from radixserve.server_args import ServerArgs


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_watchdog(timeout: float = 10.0):
    clock, events = FakeClock(), []
    watchdog = Watchdog(
        timeout,
        clock=clock,
        dump=lambda: events.append("dump"),
        exit=lambda code: events.append(("exit", code)),
    )
    return watchdog, clock, events


def test_it_fires_only_when_work_is_pending_and_steps_stall():
    watchdog, clock, events = make_watchdog(timeout=10.0)
    watchdog.feed(False)
    clock.now += 60  # idle for a minute: nothing pending, nothing wrong
    assert not watchdog.check() and events == []
    watchdog.feed(True)
    for _ in range(20):  # a busy loop that keeps stepping, each step 5 s apart
        clock.now += 5
        assert not watchdog.check()
        watchdog.feed(True)
    assert events == []
    clock.now += 10  # exactly the timeout: not yet
    assert not watchdog.check() and events == []
    clock.now += 0.5
    assert watchdog.check()
    assert events == ["dump", ("exit", WATCHDOG_EXIT_CODE)]  # the stacks first, then the exit
    assert WATCHDOG_EXIT_CODE != 0


def test_a_step_that_completes_in_time_resets_it():
    watchdog, clock, events = make_watchdog(timeout=10.0)
    watchdog.feed(True)
    clock.now += 9
    watchdog.feed(False)  # that step ended and nothing is left
    clock.now += 100
    assert not watchdog.check()
    watchdog.feed(True)
    clock.now += 9
    assert not watchdog.check() and events == []


def test_its_thread_fires_on_a_stalled_loop_and_stops_when_told():
    fired = threading.Event()
    codes = []
    watchdog = Watchdog(
        0.2, interval=0.02, dump=lambda: None, exit=lambda code: (codes.append(code), fired.set())
    )
    watchdog.feed(True)  # a step starts and never completes
    watchdog.start()
    assert fired.wait(timeout=30)
    assert codes == [WATCHDOG_EXIT_CODE]
    quiet = Watchdog(0.05, interval=0.01, dump=lambda: None, exit=lambda code: codes.append(code))
    quiet.feed(False)  # stalled, but with nothing to do
    quiet.start()
    time.sleep(0.3)
    quiet.stop()
    assert codes == [WATCHDOG_EXIT_CODE]


def test_the_dump_shows_every_threads_stack(capfd):
    parked = threading.Event()
    helper = threading.Thread(target=parked.wait, name="parked-helper", daemon=True)
    helper.start()
    try:
        _dump_all_stacks()
    finally:
        parked.set()
        helper.join()
    err = capfd.readouterr().err
    assert "Current thread 0x" in err and "\nThread 0x" in "\n" + err  # this one, the parked one
    assert "test_the_dump_shows_every_threads_stack" in err
    assert "wait" in err


def test_health_fails_on_a_silent_scheduler_only_with_requests_pending():
    silent_for = 12.0
    tm = SimpleNamespace(num_in_flight=0, last_scheduler_report=time.monotonic() - silent_for)
    assert hang_problem(tm, watchdog_timeout=10.0) is None  # idle: silence is /ready's matter
    tm.num_in_flight = 3
    problem = hang_problem(tm, watchdog_timeout=10.0)
    assert problem is not None and "3 requests pending" in problem
    assert hang_problem(tm, watchdog_timeout=20.0) is None  # not silent for long enough
    assert hang_problem(tm, watchdog_timeout=0.0) is None  # 0: off


def test_the_flag_defaults_to_five_minutes_and_zero_turns_it_off():
    assert ServerArgs().watchdog_timeout == 300.0
    assert ServerArgs(watchdog_timeout=0).watchdog_timeout == 0
    try:
        ServerArgs(watchdog_timeout=-1)
    except ValueError as exc:
        assert "--watchdog-timeout" in str(exc)
    else:
        raise AssertionError("a negative --watchdog-timeout was accepted")


class QuietSocket:
    """A socket with nothing to receive that keeps what is sent."""

    def __init__(self) -> None:
        self.sent: list = []

    def poll(self, timeout: int = 0) -> int:
        return 0

    def recv_pyobj(self, flags: int = 0):
        raise zmq.Again()

    def send_pyobj(self, obj) -> None:
        self.sent.append(obj)


class GeneratingScheduler:
    """Always has work; records what the watchdog was told before each step."""

    def __init__(self, watchdog: Watchdog) -> None:
        self.watchdog = watchdog
        self.reqs_by_rid = {"r0": object(), "r1": object()}
        self.pending_at_step: list[bool] = []

    def has_work(self) -> bool:
        return True

    def waiting_only_in_background(self) -> bool:
        return False

    def ready_grammar_rids(self) -> list[str]:
        return []

    def dispatch(self, msg):
        return None

    def step(self) -> bool:
        self.pending_at_step.append(self.watchdog.pending)
        return True

    def pop_outputs(self) -> list:
        return []

    def pop_replies(self) -> list:
        return []

    def pop_stats(self):
        return None


def test_the_loop_feeds_the_watchdog_and_leaves_mid_generation_once_its_parent_is_gone(
    monkeypatch, caplog
):
    parent = os.getppid()
    answers = itertools.chain([parent] * 3, itertools.repeat(1))  # reparented after 3 steps
    monkeypatch.setattr(scheduler_process.os, "getppid", lambda: next(answers))
    watchdog = Watchdog(10.0, clock=FakeClock(), dump=lambda: None, exit=lambda code: None)
    scheduler = GeneratingScheduler(watchdog)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with caplog.at_level(logging.WARNING, logger=scheduler_process.__name__):
            scheduler_process._serve(scheduler, QuietSocket(), QuietSocket(), [], parent, watchdog)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert scheduler.pending_at_step == [True, True, True]  # fed before every step, busy
    assert "the front end is gone; exiting with 2 requests unfinished" in caplog.text
