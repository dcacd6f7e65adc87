"""The hang watchdog on real server processes.

A scheduler that stops reporting while requests are pending fails /health (503) once it has
been silent for --watchdog-timeout; the scheduler's own watchdog, when a step outlasts the
timeout with work pending, dumps every thread's stack to the log and exits, and the front end
then exits non-zero so that the pod restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time

import aiohttp
import pytest
from test_server_lifecycle import LONG_STREAM, kill_leftovers, scheduler_pid

from radixserve.bench.server_process import ServerProcess
from radixserve.scheduler.scheduler_process import WATCHDOG_EXIT_CODE

pytestmark = pytest.mark.slow

WATCHDOG_TIMEOUT_S = 2


def test_health_fails_while_a_stopped_scheduler_has_requests_pending(tmp_path):
    args = ["--model", "random:tiny-llama", "--max-total-tokens", "4096"]
    args += ["--watchdog-timeout", str(WATCHDOG_TIMEOUT_S)]
    with ServerProcess(args, log_path=tmp_path / "log") as server:
        children = server.child_pids()
        pid = scheduler_pid(server)

        async def scenario():
            async with (
                aiohttp.ClientSession() as session,
                session.post(server.base_url + "/generate", json=LONG_STREAM) as reply,
            ):
                assert (await reply.content.readline()).startswith(b"data: {")
                assert server.get("/health")[0] == 200  # generating: healthy
                os.kill(pid, signal.SIGSTOP)  # wedged mid-generation, its watchdog with it
                try:
                    stopped_at = time.monotonic()
                    deadline = stopped_at + WATCHDOG_TIMEOUT_S + 15
                    while (reply_now := server.get("/health"))[0] == 200:
                        assert time.monotonic() < deadline, "/health never failed"
                        await asyncio.sleep(0.2)
                    return reply_now, time.monotonic() - stopped_at
                finally:
                    os.kill(pid, signal.SIGCONT)

        try:
            (status, body), after = asyncio.run(scenario())
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            server.stop(timeout=30)
            kill_leftovers(children)
    assert status == 503
    health = json.loads(body)
    assert health["status"] == "scheduler hung"
    assert "has not reported" in health["reason"]
    # not before the timeout (a report just before the stop may add up to a heartbeat)
    assert after >= WATCHDOG_TIMEOUT_S - 1.0


def test_the_watchdog_ends_a_scheduler_whose_step_outlasts_it(tmp_path):
    """With a timeout far shorter than any step (1 ms), the first request's steps count as a
    hang: the scheduler dumps its threads' stacks into the log and exits with the watchdog's
    status; the front end fails the request with 503 and exits 1."""
    log = tmp_path / "log"
    args = ["--model", "random:tiny-llama", "--max-total-tokens", "4096"]
    args += ["--watchdog-timeout", "0.001"]
    with ServerProcess(args, log_path=log) as server:
        children = server.child_pids()
        assert server.get("/health")[0] == 200  # idle: no step pending, nothing fires

        async def scenario():
            async with (
                aiohttp.ClientSession() as session,
                session.post(server.base_url + "/generate", json=LONG_STREAM) as reply,
            ):
                return reply.status, await asyncio.wait_for(reply.read(), timeout=60)

        try:
            status, body = asyncio.run(scenario())
            exit_status = server.process.wait(timeout=30)
        finally:
            kill_leftovers(children)
    # a 503 before the stream's first event, or an error event in it
    assert status in (200, 503) and b"scheduler" in body
    assert exit_status == 1
    text = log.read_text()
    assert "watchdog: the scheduler loop has not completed a step" in text
    assert "Current thread 0x" in text and "in _serve" in text  # the stacks, the loop's among them
    assert f"the scheduler process exited (exit code {WATCHDOG_EXIT_CODE})" in text
    assert "shutting down with exit status 1" in text
