"""The router in front of the worker's other APIs: Anthropic's Messages (and count_tokens),
`GET /v1/models/{id}`, and OpenAI's Responses with its affinity (a stored response's requests
go to the worker that made it).

A real router app on a loopback port in front of scripted workers (`router_harness`), as in
`test_router_proxy.py`; the last test runs `radixserve router` and the workers as processes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
from router_harness import ScriptedWorker, free_port, running_router, wait_until

from radixserve.bench.server_process import ServerProcess
from radixserve.router.apis import parse_event

HARNESS = Path(__file__).with_name("router_harness.py")


def metric(router, name: str, **labels: str) -> float:
    value = router.metrics.registry.get_sample_value(name, {"model_name": "m", **labels})
    return 0.0 if value is None else value


def message(stream: bool = False, text: str = "Hi") -> dict:
    turns = [{"role": "user", "content": text}]
    return {"model": "m", "max_tokens": 8, "messages": turns, "stream": stream}


def events_of(raw: bytes) -> list[tuple[str | None, object]]:
    """Each event's name and decoded data, from the raw bytes of a stream."""
    out = []
    for block in raw.split(b"\n\n"):
        if block.strip():
            name, data = parse_event(block)
            assert data is not None, block
            out.append((name.decode() if name else None, json.loads(data)))
    return out


def test_messages_count_tokens_and_model_go_to_a_worker_with_the_clients_x_api_key() -> None:
    async def scenario() -> None:
        worker = await ScriptedWorker("w").start()
        async with (
            running_router(worker_url=(worker.url,), api_key="k") as (router, url),
            aiohttp.ClientSession() as session,
        ):
            await wait_until(lambda: router.pool.ready())
            key = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
            async with session.post(url + "/v1/messages", json=message(), headers=key) as reply:
                assert reply.status == 200
                assert reply.headers["X-Radixserve-Worker"] == worker.url
                assert (await reply.json())["content"] == [{"type": "text", "text": "from w"}]
            async with session.post(
                url + "/v1/messages/count_tokens", json=message(), headers=key
            ) as reply:
                assert reply.status == 200 and await reply.json() == {"input_tokens": 7}
            async with session.get(url + "/v1/models/org/some-model", headers=key) as reply:
                assert (await reply.json())["id"] == "org/some-model"
            assert worker.api_keys == ["k", "k", "k"]  # the client's header reached the worker
            async with session.get(url + "/get_server_info", headers=key) as reply:
                assert reply.status == 200  # the admin paths take x-api-key too
            assert [r["messages"] for r in worker.requests] == [message()["messages"]] * 2

            # A wrong key is refused by the router, in Anthropic's shape on its paths.
            for path in ("/v1/messages", "/v1/messages/count_tokens"):
                wrong = {"x-api-key": "nope"}
                async with session.post(url + path, json=message(), headers=wrong) as reply:
                    assert reply.status == 401
                    body = await reply.json()
                    assert body["type"] == "error"
                    assert body["error"]["type"] == "authentication_error"
                    assert "x-api-key" in body["error"]["message"]
            async with session.post(
                url + "/v1/chat/completions", json={}, headers={"x-api-key": "nope"}
            ) as reply:
                assert reply.status == 401  # OpenAI's shape elsewhere
                assert (await reply.json())["error"]["code"] == "invalid_api_key"
            async with session.post(url + "/v1/messages/nope", json={}, headers=key) as reply:
                assert reply.status == 404
                assert (await reply.json())["error"]["type"] == "not_found_error"
            assert len(worker.requests) == 2

            # The worker's own Anthropic error passes through as it is.
            worker.mode, worker.status = "status", 400
            async with session.post(url + "/v1/messages", json=message(), headers=key) as reply:
                assert reply.status == 400
                assert await reply.json() == {
                    "type": "error",
                    "error": {"type": "invalid_request_error", "message": "w says no"},
                }
        await worker.stop()

    asyncio.run(scenario())


def test_an_anthropic_stream_is_relayed_unchanged_and_a_broken_one_ends_in_its_shape() -> None:
    async def scenario() -> None:
        worker = await ScriptedWorker("w").start()
        async with (
            running_router(worker_url=(worker.url,)) as (router, url),
            aiohttp.ClientSession() as session,
        ):
            await wait_until(lambda: router.pool.ready())
            async with session.post(url + "/v1/messages", json=message(True)) as reply:
                assert reply.status == 200
                assert reply.headers["Content-Type"].startswith("text/event-stream")
                raw = await reply.read()
            events = events_of(raw)
            assert [name for name, _ in events] == [
                "message_start",
                "content_block_start",
                "ping",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
            assert all(name == data["type"] for name, data in events)  # type: ignore[index]
            assert b"[DONE]" not in raw and raw.endswith(b'data: {"type": "message_stop"}\n\n')

            worker.mode = "break"  # the connection dies before message_stop
            async with session.post(url + "/v1/messages", json=message(True)) as reply:
                events = events_of(await reply.read())
            assert [name for name, _ in events][:-1] == [
                "message_start",
                "content_block_start",
                "ping",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
            ]
            name, error = events[-1]
            assert name == "error" and error["type"] == "error"  # type: ignore[index]
            assert error["error"]["type"] == "api_error"  # type: ignore[index]
            assert "stopped mid-stream" in error["error"]["message"]  # type: ignore[index]
            errors = "radixserve_router_upstream_errors_total"
            assert metric(router, errors, worker=worker.url, kind="stream_broken") == 1
        await worker.stop()

    asyncio.run(scenario())


def test_router_errors_on_messages_are_anthropic_shaped() -> None:
    async def scenario() -> None:
        async with (
            running_router(worker_url=("http://127.0.0.1:9",), pending_timeout=0.2) as (_, url),
            aiohttp.ClientSession() as session,
        ):
            async with session.post(url + "/v1/messages", json=message()) as reply:
                assert reply.status == 503 and reply.headers["Retry-After"] == "1"
                body = await reply.json()
            assert body["type"] == "error" and body["error"]["type"] == "overloaded_error"
            assert "no ready worker" in body["error"]["message"]

    asyncio.run(scenario())


def test_a_draining_workers_anthropic_503_is_retried_a_dead_ones_is_not() -> None:
    async def scenario() -> None:
        # Anthropic's 503 body carries no error code: the worker's error-code header does.
        refusing = ScriptedWorker("refusing", mode="status", status=503)
        fine = ScriptedWorker("fine")
        await refusing.start()
        await fine.start()
        urls = (refusing.url, fine.url)
        async with (
            running_router(worker_url=urls, policy="round_robin", health_check_interval=3600) as (
                router,
                url,
            ),
            aiohttp.ClientSession() as session,
        ):
            await wait_until(lambda: len(router.pool.ready()) == 2)
            refusing.ready = False  # draining since the last probe: its 503 says `draining`
            for _ in range(2):
                async with session.post(url + "/v1/messages", json=message()) as reply:
                    assert reply.status == 200
                    assert reply.headers["X-Radixserve-Worker"] == fine.url
            assert len(refusing.requests) == 1
            assert metric(router, "radixserve_router_retries_total") == 1

            refusing.ready, refusing.dead = True, True  # its scheduler died with the request
            router.pool.set_state(router.pool.get(refusing.url), "ready")
            for _ in range(2):  # round robin reaches it within two requests
                async with session.post(url + "/v1/messages", json=message("x")) as reply:
                    if reply.headers["X-Radixserve-Worker"] == refusing.url:
                        assert reply.status == 503  # its answer, not retried elsewhere
                        assert (await reply.json())["error"]["type"] == "overloaded_error"
            assert len(refusing.requests) == 2
            assert metric(router, "radixserve_router_retries_total") == 1
        await refusing.stop()
        await fine.stop()

    asyncio.run(scenario())


def test_a_stored_response_s_requests_go_to_the_worker_that_made_it() -> None:
    async def scenario() -> None:
        a, b = ScriptedWorker("a"), ScriptedWorker("b")
        await a.start()
        await b.start()
        workers = {a.url: a, b.url: b}
        # round robin: left to itself the policy sends every other request elsewhere
        async with (
            running_router(worker_url=(a.url, b.url), policy="round_robin") as (router, url),
            aiohttp.ClientSession() as session,
        ):
            await wait_until(lambda: len(router.pool.ready()) == 2)

            async def create(**fields) -> tuple[int, dict, str]:
                body = {"model": "m", "input": "Hi", **fields}
                async with session.post(url + "/v1/responses", json=body) as reply:
                    worker = reply.headers.get("X-Radixserve-Worker", "")
                    return reply.status, await reply.json(), worker

            status, first, maker = await create()
            assert status == 200 and first["id"] in workers[maker].stored
            for _ in range(3):
                status, reply, worker = await create(previous_response_id=first["id"])
                assert (status, worker) == (200, maker)
                first = reply  # the conversation goes on, on the same worker
            affinity = "radixserve_router_requests_total"
            assert metric(router, affinity, worker=maker, decision="affinity") == 3

            # A streamed response is learnt from its response.created event.
            body = {"model": "m", "input": "Hi", "stream": True}
            async with session.post(url + "/v1/responses", json=body) as reply:
                streamer = reply.headers["X-Radixserve-Worker"]
                events = events_of(await reply.read())
            assert [name for name, _ in events] == [
                "response.created",
                "response.output_text.delta",
                "response.completed",
            ]
            streamed = events[0][1]["response"]["id"]  # type: ignore[index]
            for _ in range(2):
                async with session.get(url + f"/v1/responses/{streamed}") as reply:
                    assert reply.status == 200 and reply.headers["X-Radixserve-Worker"] == streamer
            async with session.delete(url + f"/v1/responses/{streamed}") as reply:
                assert reply.status == 200 and (await reply.json())["deleted"] is True
            assert router.affinity.holder(streamed) is None  # deleted: forgotten

            # `store: false` keeps nothing, so the router remembers nothing either.
            status, unstored, _ = await create(store=False)
            assert status == 200 and router.affinity.holder(unstored["id"]) is None

            # An id the router never saw is routed as usual; a worker's 404 sends it on to the
            # next, and the one holding it answers (made through another router replica).
            for _ in range(2):  # round robin: one of the two asks the wrong worker first
                router.affinity.forget(first["id"])
                status, reply, worker = await create(previous_response_id=first["id"], store=False)
                assert (status, worker) == (200, maker)
                assert router.affinity.holder(first["id"]) == maker  # learnt again
            assert metric(router, "radixserve_router_retries_total") >= 1
            unknown = "resp_" + "0" * 32
            status, reply, _ = await create(previous_response_id=unknown)
            assert status == 404 and reply["error"]["code"] == "not_found"
            assert [r.get("previous_response_id") for r in a.requests + b.requests].count(
                unknown
            ) == 2  # asked each worker once

            # The maker goes down: its responses went with it, and the router says so.
            await workers[maker].stop()
            await wait_until(lambda: router.pool.get(maker).state == "down")
            served_before = sum(len(w.requests) for w in workers.values())
            status, reply, worker = await create(previous_response_id=first["id"])
            assert status == 404 and worker == ""
            assert reply == {
                "error": {
                    "message": f"response {first['id']!r} is not held by any ready worker: it"
                    f" was made on the worker {maker}, which is down",
                    "type": "invalid_request_error",
                    "param": "previous_response_id",
                    "code": "response_not_found",
                }
            }
            async with session.get(url + f"/v1/responses/{first['id']}") as reply:
                assert reply.status == 404
                error = (await reply.json())["error"]
                assert error["code"] == "response_not_found" and error["param"] is None
            assert sum(len(w.requests) for w in workers.values()) == served_before
        await a.stop()
        await b.stop()

    asyncio.run(scenario())


def test_a_broken_responses_stream_ends_with_its_error_event() -> None:
    async def scenario() -> None:
        worker = await ScriptedWorker("w", mode="break").start()
        async with (
            running_router(worker_url=(worker.url,)) as (router, url),
            aiohttp.ClientSession() as session,
        ):
            await wait_until(lambda: router.pool.ready())
            body = {"model": "m", "input": "Hi", "stream": True}
            async with session.post(url + "/v1/responses", json=body) as reply:
                raw = await reply.read()
            events = events_of(raw)
            assert [name for name, _ in events] == [
                "response.created",
                "response.output_text.delta",
                "error",
            ]
            error = events[-1][1]
            assert error["code"] == "upstream_disconnected"  # type: ignore[index]
            assert error["sequence_number"] == 2  # type: ignore[index]
            assert b"[DONE]" not in raw
        await worker.stop()

    asyncio.run(scenario())


def test_through_a_router_process_a_follow_up_finds_its_worker_or_a_clear_404(
    tmp_path: Path,
) -> None:
    """`radixserve router` in its own process, two scripted workers in theirs: a response's
    follow-ups and retrieval go to the worker that made it; once that process is killed, a
    follow-up gets the router's 404 naming the id, and the other worker never sees it."""
    workers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name in ("a", "b"):
            port = free_port()
            command = [sys.executable, str(HARNESS), "--port", str(port), "--name", name]
            workers[f"http://127.0.0.1:{port}"] = subprocess.Popen(command)
        for url in workers:
            wait_for(lambda url=url: call("GET", url + "/ready")[0] == 200)
        args = [arg for url in workers for arg in ("--worker-url", url)]
        args += ["--policy", "round_robin", "--health-check-interval", "0.2"]
        with ServerProcess(args, tmp_path / "router.log", subcommand="router") as router:
            base = router.base_url
            status, headers, made = call("POST", base + "/v1/responses", {"input": "Hi"})
            assert status == 200
            maker = headers["X-Radixserve-Worker"]
            for _ in range(3):  # round robin would alternate
                follow_up = {"input": "More", "previous_response_id": made["id"]}
                status, headers, _ = call("POST", base + "/v1/responses", follow_up)
                assert (status, headers["X-Radixserve-Worker"]) == (200, maker)
            status, headers, _ = call("GET", base + f"/v1/responses/{made['id']}")
            assert (status, headers["X-Radixserve-Worker"]) == (200, maker)

            workers[maker].kill()
            workers[maker].wait(timeout=30)
            wait_for(lambda: call("GET", base + "/ready")[2].get("ready_workers") == 1)
            status, headers, reply = call("POST", base + "/v1/responses", follow_up)
            assert status == 404 and "X-Radixserve-Worker" not in headers
            assert reply["error"]["code"] == "response_not_found"
            assert reply["error"]["param"] == "previous_response_id"
            assert (
                f"response {made['id']!r} is not held by any ready worker"
                in (reply["error"]["message"])
            )
            status, _, _ = call("POST", base + "/v1/responses", {"input": "New"})
            assert status == 200  # the survivor serves everything else
    finally:
        for process in workers.values():
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)


def call(method: str, url: str, body: dict | None = None) -> tuple[int, dict, dict]:
    data = json.dumps({"model": "m", **body}).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, dict(reply.headers), json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read() or b"{}")
    except OSError:
        return 0, {}, {}


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)
