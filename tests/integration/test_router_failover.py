"""The router (`radixserve router`, its own process) in front of real workers that fail.

Three bundled-SmolLM2 workers on the CPU serve the module. In file order: the OpenAI client
through the router; a client that hangs up; a worker that is SIGTERMed (it drains, gets
nothing new); a worker that is SIGKILLed mid-stream (its streams end with an error event, the
requests that had not started on it are retried elsewhere); and every worker gone (requests
wait and are served when a worker comes back).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator

import aiohttp
import openai
import pytest

from radixserve.bench.router import metric_sum, started_router, started_workers
from radixserve.bench.server_process import ServerProcess

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
SERVE_ARGS = ["--device", "cpu", "--max-running-requests", "4", "--max-total-tokens", "4096"]


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    logs = tmp_path_factory.mktemp("workers")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")  # three workers share two cores
        with started_workers(3, [*SERVE_ARGS, "--drain-timeout", "120"], logs) as started:
            yield started


def metrics(server: ServerProcess) -> str:
    status, body = server.get("/metrics")
    assert status == 200
    return body.decode()


def finished_requests(worker: ServerProcess) -> float:
    return metric_sum(metrics(worker), "radixserve_requests_total")


def kill_hard(worker: ServerProcess) -> None:
    """What a node failure does: the front end and the scheduler die at once, no drain."""
    for pid in [*worker.child_pids(), worker.process.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    worker.process.wait(timeout=30)


def stream_body(max_tokens: int = 48) -> dict:
    return {
        "model": MODEL,
        "prompt": "Tell me a long story about a lighthouse keeper.",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }


async def events_of(reply: aiohttp.ClientResponse) -> list:
    events: list = []
    async for line in reply.content:
        if line.startswith(b"data: "):
            data = line[6:].strip()
            events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return events


def test_the_openai_client_gets_the_workers_api_through_the_router(workers, tmp_path) -> None:
    urls = [w.base_url for w in workers]
    with started_router(urls, ["--model-name", MODEL], tmp_path / "router.log") as router:
        client = openai.OpenAI(base_url=router.base_url + "/v1", api_key="unused", timeout=120)
        assert [m.id for m in client.models.list().data] == [MODEL]
        chat = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi!"}], max_tokens=4, temperature=0
        )
        assert chat.choices[0].message.content and chat.usage.completion_tokens == 4
        pieces = client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0, stream=True
        )
        assert "".join(c.choices[0].text for c in pieces if c.choices)
        # The same prompt straight at a worker: the router changes nothing in the answer.
        direct = openai.OpenAI(base_url=urls[0] + "/v1", api_key="unused", timeout=120)
        asked = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 5}
        assert (
            client.completions.create(**asked, temperature=0).choices[0].text
            == direct.completions.create(**asked, temperature=0).choices[0].text
        )
        # A request the workers refuse gets their error, unchanged.
        with pytest.raises(openai.NotFoundError) as not_found:
            client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
        with pytest.raises(openai.NotFoundError) as from_worker:
            direct.completions.create(model="no-such-model", prompt="x", max_tokens=1)
        assert not_found.value.body == from_worker.value.body
        with pytest.raises(openai.BadRequestError) as bad:
            client.completions.create(model=MODEL, prompt="x", max_tokens=-1)
        assert bad.value.body["param"] == "max_tokens"
        status, body = router.get("/generate")  # wrong method: the router's own 405
        assert status == 405 and json.loads(body)["error"]["type"] == "invalid_request_error"
        text = metrics(router)
        assert metric_sum(text, "radixserve_router_requests_total") >= 6
        assert metric_sum(text, "radixserve_router_retries_total") == 0


def test_a_client_that_hangs_up_aborts_its_request_on_the_worker(workers, tmp_path) -> None:
    worker = workers[0]
    with started_router([worker.base_url], [], tmp_path / "router.log") as router:

        async def hang_up() -> None:
            async with aiohttp.ClientSession() as session:
                reply = await session.post(
                    router.base_url + "/v1/completions", json=stream_body(max_tokens=400)
                )
                assert (await reply.content.readline()).startswith(b"data: {")
                reply.close()

        def aborts() -> float:
            found = [
                line for line in metrics(worker).splitlines() if 'finish_reason="abort"' in line
            ]
            return sum(float(line.rsplit(" ", 1)[1]) for line in found)

        start = aborts()
        asyncio.run(hang_up())
        deadline = time.monotonic() + 60
        while aborts() == start and time.monotonic() < deadline:
            time.sleep(0.2)
        assert aborts() == start + 1  # the worker aborted it, long before its 400 tokens


def test_a_draining_worker_gets_no_new_requests(workers, tmp_path) -> None:
    draining, other = workers[0], workers[1]
    args = ["--policy", "round_robin", "--health-check-interval", "0.2"]
    with started_router([draining.base_url, other.base_url], args, tmp_path / "r.log") as router:

        async def scenario() -> tuple[list[int], float, float]:
            async with aiohttp.ClientSession() as session:
                # A long stream keeps the worker draining (not exited) for the whole test.
                held = await session.post(
                    draining.base_url + "/v1/completions", json=stream_body(max_tokens=2000)
                )
                assert (await held.content.readline()).startswith(b"data: {")
                before = finished_requests(draining)
                draining.process.send_signal(signal.SIGTERM)
                await asyncio.sleep(1.0)  # a few probe rounds
                statuses = []
                for i in range(8):
                    body = {"model": MODEL, "prompt": f"Count to {i}:", "max_tokens": 2}
                    async with session.post(router.base_url + "/v1/completions", json=body) as r:
                        statuses.append(r.status)
                after = finished_requests(draining)
                held.close()
                return statuses, before, after

        statuses, before, after = asyncio.run(scenario())
        assert statuses == [200] * 8
        assert after == before  # nothing new ran on the draining worker
        text = metrics(router)
        gone = [line for line in text.splitlines() if line.startswith("radixserve_router_workers")]
        assert any('state="ready"' in line and line.endswith(" 1.0") for line in gone), gone
    assert draining.process.wait(timeout=60) == 0


def test_a_killed_worker_fails_its_streams_loudly_and_the_rest_is_retried(
    workers, tmp_path
) -> None:
    victim, survivor = workers[1], workers[2]
    # One probe at start, then none: the router learns of the death from requests alone.
    args = ["--policy", "round_robin", "--health-check-interval", "3600"]
    with started_router([victim.base_url, survivor.base_url], args, tmp_path / "r.log") as router:

        async def scenario() -> tuple[dict[str, list], list[int]]:
            async with aiohttp.ClientSession() as session:
                streams = [
                    await session.post(router.base_url + "/v1/completions", json=stream_body(200))
                    for _ in range(2)
                ]
                by_worker = {s.headers["X-Radixserve-Worker"]: s for s in streams}
                assert set(by_worker) == {victim.base_url, survivor.base_url}
                for stream in streams:
                    assert (await stream.content.readline()).startswith(b"data: {")
                kill_hard(victim)
                events = {url: await events_of(s) for url, s in by_worker.items()}
                statuses = []
                for i in range(4):
                    body = {"model": MODEL, "prompt": f"Say {i}.", "max_tokens": 2}
                    async with session.post(router.base_url + "/v1/completions", json=body) as r:
                        statuses.append(r.status)
                return events, statuses

        events, statuses = asyncio.run(scenario())
        broken, whole = events[victim.base_url], events[survivor.base_url]
        assert broken[-2]["error"]["code"] == "upstream_disconnected" and broken[-1] == "[DONE]"
        assert all("error" not in e for e in whole[:-1]) and whole[-1] == "[DONE]"
        assert whole[-2]["choices"][0]["finish_reason"] == "length"
        assert statuses == [200] * 4  # the ones sent to the dead worker went elsewhere
        text = metrics(router)
        assert metric_sum(text, "radixserve_router_retries_total") >= 1
        errors = [line for line in text.splitlines() if line.startswith("radixserve_router_up")]
        assert any('kind="connect"' in e and victim.base_url in e for e in errors), errors
        assert any('kind="stream_broken"' in e and victim.base_url in e for e in errors), errors


def test_with_every_worker_down_requests_wait_until_one_comes_back(workers, tmp_path) -> None:
    last = workers[2]
    port = last.port
    last.stop()  # SIGTERM: drains (nothing in flight) and exits
    args = ["--worker-url", last.base_url, "--pending-timeout", "300"]
    args += ["--health-check-interval", "0.3", "--model-name", MODEL]
    router = ServerProcess(args, tmp_path / "router.log", subcommand="router")
    try:
        deadline = time.monotonic() + 60
        while not _healthy(router):
            assert time.monotonic() < deadline, "the router did not start"
            time.sleep(0.2)
        assert router.get("/ready")[0] == 503

        async def scenario() -> list[int]:
            timeout = aiohttp.ClientTimeout(total=None)  # a worker's cold start takes a while
            async with aiohttp.ClientSession(timeout=timeout) as session:

                async def ask(i: int) -> int:
                    body = {"model": MODEL, "prompt": f"Hello {i}", "max_tokens": 2}
                    async with session.post(router.base_url + "/v1/completions", json=body) as r:
                        return r.status

                waiting = [asyncio.create_task(ask(i)) for i in range(3)]
                while metric_sum(metrics(router), "radixserve_router_pending_requests") < 3:
                    await asyncio.sleep(0.1)
                assert not any(task.done() for task in waiting)
                revived = ServerProcess(SERVE_ARGS, tmp_path / "revived.log", port=port)
                workers[2] = revived  # the fixture stops it at the end
                return await asyncio.gather(*waiting)

        assert asyncio.run(scenario()) == [200, 200, 200]
        assert metric_sum(metrics(router), "radixserve_router_pending_requests") == 0
        assert router.get("/ready")[0] == 200
    finally:
        router.stop()


def _healthy(server: ServerProcess) -> bool:
    try:
        return server.get("/health", timeout=1)[0] == 200
    except OSError:
        return False
