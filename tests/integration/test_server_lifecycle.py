"""Server lifecycle over real processes: SIGTERM drain, a dying scheduler (the front end exits
non-zero), a dying front end (the scheduler follows at once), a full queue."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from radixserve.bench.server_process import ServerProcess

pytestmark = pytest.mark.slow


def scheduler_pid(server: ServerProcess) -> int:
    """The multiprocessing 'spawn' child (the other child is the resource tracker)."""
    for pid in server.child_pids():
        if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    raise AssertionError("no scheduler process found")


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def wait_until(condition, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


async def read_events(reply: aiohttp.ClientResponse) -> list[dict | str]:
    events: list[dict | str] = []
    async for line in reply.content:
        if line.startswith(b"data: "):
            data = line.removeprefix(b"data: ").strip()
            events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return events


def test_sigterm_drains_an_in_flight_stream_and_exits_zero(tmp_path):
    """The default model (bundled SmolLM2): a stream started before SIGTERM completes."""
    server = ServerProcess(
        ["--max-total-tokens", "2048", "--drain-timeout", "120"], log_path=tmp_path / "log"
    )
    with server:
        children = server.child_pids()
        assert children

        async def scenario():
            async with aiohttp.ClientSession() as session:
                body = {"model": "smollm2-135m", "prompt": "Tell me a story.", "max_tokens": 24}
                body.update(stream=True, ignore_eos=True)
                async with session.post(server.base_url + "/v1/completions", json=body) as reply:
                    first = await reply.content.readline()
                    assert first.startswith(b"data: {")
                    server.process.send_signal(signal.SIGTERM)
                    await asyncio.sleep(0.5)
                    async with session.get(server.base_url + "/ready") as ready:
                        ready_status = ready.status
                    async with session.post(server.base_url + "/v1/completions", json=body) as new:
                        refused = (new.status, new.headers.get("Retry-After"), await new.json())
                    rest = await read_events(reply)
            return ready_status, refused, [json.loads(first.removeprefix(b"data: ")), *rest]

        ready_status, refused, events = asyncio.run(scenario())
        assert ready_status == 503
        assert refused[0] == 503 and refused[1] is not None
        assert refused[2]["error"]["code"] == "draining"
        assert events[-1] == "[DONE]"
        assert events[-2]["choices"][0]["finish_reason"] == "length"
        assert server.process.wait(timeout=120) == 0
    assert wait_until(lambda: not any(pid_exists(pid) for pid in children))


def kill_leftovers(pids: list[int]) -> None:
    for pid in pids:
        if pid_exists(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


LONG_STREAM = {
    "input_ids": [1, 2, 3],
    "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True},
    "stream": True,
}


def test_a_dead_scheduler_fails_requests_and_the_server_exits_non_zero(tmp_path):
    """The in-flight stream fails with a 503-shaped error, then the front end exits 1 within
    seconds (so that Kubernetes restarts the pod) and its log says why."""
    log = tmp_path / "log"
    args = ["--model", "random:tiny-llama", "--max-total-tokens", "4096"]
    with ServerProcess(args, log_path=log) as server:
        assert server.get("/health")[0] == 200
        children = server.child_pids()

        async def scenario():
            async with (
                aiohttp.ClientSession() as session,
                session.post(server.base_url + "/generate", json=LONG_STREAM) as reply,
            ):
                assert (await reply.content.readline()).startswith(b"data: {")
                os.kill(scheduler_pid(server), signal.SIGKILL)
                killed_at = time.monotonic()
                return killed_at, await asyncio.wait_for(read_events(reply), timeout=60)

        try:
            killed_at, events = asyncio.run(scenario())
            errors = [e for e in events if isinstance(e, dict) and "error" in e]
            assert errors and "scheduler" in errors[0]["error"]["message"]
            assert errors[0]["error"]["code"] == "unavailable"
            status = server.process.wait(timeout=30)
            exited_after = time.monotonic() - killed_at
        finally:
            kill_leftovers(children)
    assert status == 1
    assert exited_after < 10, f"the front end took {exited_after:.1f}s to exit"
    text = log.read_text()
    assert "the scheduler process exited (exit code -9)" in text
    assert "the scheduler process is gone: shutting down with exit status 1" in text


def test_the_scheduler_dies_with_its_front_end(tmp_path):
    """A front end SIGKILLed mid-generation takes its scheduler along at once (the kernel's
    parent-death signal and the loop's check of its parent), not after minutes of generating
    for nobody."""
    args = ["--model", "random:tiny-llama", "--max-total-tokens", "4096"]
    server = ServerProcess(args, log_path=tmp_path / "log")
    with server:
        children = server.child_pids()
        scheduler = scheduler_pid(server)

        async def scenario():
            async with (
                aiohttp.ClientSession() as session,
                session.post(server.base_url + "/generate", json=LONG_STREAM) as reply,
            ):
                assert (await reply.content.readline()).startswith(b"data: {")
                assert (await reply.content.readline()) is not None
                server.process.kill()  # mid-generation: 2000 tokens take far longer than this
                killed_at = time.monotonic()
                server.process.wait(timeout=10)
                gone = wait_until(lambda: not pid_exists(scheduler), timeout=10)
                return gone, time.monotonic() - killed_at

        try:
            gone, after = asyncio.run(scenario())
        finally:
            kill_leftovers(children)
    print(f"the scheduler was gone {after:.2f}s after its front end")
    assert gone, "the scheduler outlived its front end"
    assert after < 2.0, f"the scheduler took {after:.1f}s to notice its front end was gone"


def test_a_full_queue_answers_429_with_retry_after(tmp_path):
    args = ["--model", "random:tiny-llama", "--max-total-tokens", "4096"]
    args += ["--max-queued-requests", "2", "--max-running-requests", "1"]
    with ServerProcess(args, log_path=tmp_path / "log") as server:

        async def scenario():
            body = {
                "input_ids": [5, 6, 7],
                "sampling_params": {"max_new_tokens": 64, "ignore_eos": True},
            }
            async with aiohttp.ClientSession() as session:

                async def one():
                    async with session.post(server.base_url + "/generate", json=body) as reply:
                        return reply.status, reply.headers.get("Retry-After"), await reply.json()

                return await asyncio.gather(*(one() for _ in range(8)))

        replies = asyncio.run(scenario())
        statuses = sorted(status for status, _, _ in replies)
        assert 429 in statuses
        assert set(statuses) <= {200, 429}
        for status, retry_after, body in replies:
            if status == 429:
                assert retry_after is not None
                assert body["error"]["type"] == "rate_limit_error"
            else:
                assert len(body["output_ids"]) == 64
        assert server.get("/health")[0] == 200


def test_drain_timeout_aborts_what_is_left_and_still_exits_zero(tmp_path):
    args = ["--model", "random:tiny-llama", "--max-total-tokens", "4096", "--drain-timeout", "1"]
    with ServerProcess(args, log_path=tmp_path / "log") as server:

        async def scenario():
            body = {
                "input_ids": [4, 2],
                "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True},
                "stream": True,
            }
            async with (
                aiohttp.ClientSession() as session,
                session.post(server.base_url + "/generate", json=body) as reply,
            ):
                assert (await reply.content.readline()).startswith(b"data: {")
                server.process.send_signal(signal.SIGTERM)
                return await asyncio.wait_for(read_events(reply), timeout=60)

        events = asyncio.run(scenario())
        assert events[-1] == "[DONE]"
        assert "aborted" in events[-2]["error"]["message"]
        assert server.process.wait(timeout=60) == 0
