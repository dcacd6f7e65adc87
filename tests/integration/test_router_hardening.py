"""One request must never take a worker down, or a fleet: the router's side, against scripted
workers in-process (a real router app on a loopback port, as in `test_router_proxy.py`).

A request whose worker died with it inside is answered, not retried; its second coincident
death quarantines it. Admin calls authenticate before they touch anything and cannot hang on a
worker. Bodies nested too deep get 400, and client text reaches the log escaped.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from router_harness import (
    SCHEDULER_GONE,
    ScriptedWorker,
    free_port,
    running_router,
    wait_until,
)

from radixserve.router import server as router_server

POISON = "POISON-PILL"


def metric(router, name: str, **labels: str) -> float:
    value = router.metrics.registry.get_sample_value(name, {"model_name": "m", **labels})
    return 0.0 if value is None else value


def completion(prompt: str = "hello") -> dict:
    return {"model": "m", "prompt": prompt, "max_tokens": 4}


def poisoned(worker: ScriptedWorker) -> int:
    return sum(POISON in str(body.get("prompt")) for body in worker.requests)


async def post(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, dict, str]:
    async with session.post(url + "/v1/completions", json=body) as reply:
        return reply.status, await reply.json(), reply.headers.get("X-Radixserve-Worker", "")


def test_a_worker_whose_scheduler_died_with_the_request_is_not_retried_and_then_quarantined(
    caplog,
) -> None:
    """The worker answers 503 `unavailable` (its scheduler is gone) and turns not ready. The
    other worker never sees that request; after the first worker comes back and dies of the
    same request again, identical requests are refused with 400 and reach no worker."""

    async def scenario() -> None:
        a = ScriptedWorker("a", poison=POISON, poison_death="scheduler_gone")
        b = ScriptedWorker("b", poison=POISON, poison_death="scheduler_gone")
        for worker in (a, b):
            await worker.start()
        async with (
            running_router(worker_url=(a.url, b.url), health_check_interval=0.05) as (r, url),
            aiohttp.ClientSession() as session,
        ):
            await wait_until(lambda: len(r.pool.ready()) == 2)
            body = completion(f"please take the {POISON} now")
            status, reply, first = await post(session, url, body)
            victim, other = (a, b) if first == a.url else (b, a)
            assert status == 503  # the worker's own answer, not a retry's
            assert reply["error"]["code"] == "unavailable"
            assert reply["error"]["message"] == SCHEDULER_GONE
            assert (poisoned(victim), poisoned(other)) == (1, 0)
            assert r.pool.get(victim.url).state != "ready"
            assert metric(r, "radixserve_router_retries_total") == 0
            # The survivor serves everything else meanwhile.
            for i in range(3):
                status, reply, served_by = await post(session, url, completion(f"fine {i}"))
                assert (status, served_by) == (200, other.url)
            # The victim restarts; the same request goes back to it (it holds its prefix) and
            # kills it again.
            victim.revive()
            await wait_until(lambda: r.pool.get(victim.url).state == "ready")
            status, reply, served_by = await post(session, url, body)
            assert (status, served_by) == (503, victim.url)
            assert (poisoned(victim), poisoned(other)) == (2, 0)
            # Quarantined: refused by the router itself, even with both workers ready.
            victim.revive()
            await wait_until(lambda: len(r.pool.ready()) == 2)
            for _ in range(2):
                status, reply, served_by = await post(session, url, body)
                assert status == 400 and served_by == ""
                assert reply["error"]["code"] == "request_quarantined"
                assert reply["error"]["type"] == "invalid_request_error"
                assert "two worker failures" in reply["error"]["message"]
            assert (poisoned(victim), poisoned(other)) == (2, 0)
            assert metric(r, "radixserve_router_quarantined_requests_total") == 2
            # Only that exact request: the same prompt with another max_tokens goes through to
            # a worker (and kills it: its first strike).
            status, _, _ = await post(session, url, {**body, "max_tokens": 5})
            assert status == 503
            status, reply, _ = await post(session, url, completion("still fine"))
            assert status == 200
        for worker in (a, b):
            await worker.stop()

    with caplog.at_level(logging.INFO, logger="radixserve.router"):
        asyncio.run(scenario())
    announced = [
        record for record in caplog.records if "two worker failures" in record.getMessage()
    ]
    assert len(announced) == 1  # logged once, however often it is refused


def test_a_connection_broken_after_the_request_was_sent_is_a_502_not_a_retry() -> None:
    async def scenario() -> None:
        a = ScriptedWorker("a", poison=POISON, poison_death="disconnect")
        b = ScriptedWorker("b", poison=POISON, poison_death="disconnect")
        for worker in (a, b):
            await worker.start()
        async with (
            running_router(
                worker_url=(a.url, b.url), policy="round_robin", health_check_interval=3600
            ) as (r, url),
            aiohttp.ClientSession() as session,
        ):
            await wait_until(lambda: len(r.pool.ready()) == 2)
            body = completion(POISON)
            async with session.post(url + "/v1/completions", json=body) as reply:
                assert reply.status == 502
                error = (await reply.json())["error"]
                victim_url = reply.headers["X-Radixserve-Worker"]
            assert error["code"] == "upstream_failed" and error["type"] == "server_error"
            assert poisoned(a) + poisoned(b) == 1  # one worker got it, the other never did
            assert r.pool.get(victim_url).state == "down"
            errors = "radixserve_router_upstream_errors_total"
            assert metric(r, errors, worker=victim_url, kind="disconnected") == 1
            assert metric(r, "radixserve_router_retries_total") == 0
        for worker in (a, b):
            await worker.stop()

    asyncio.run(scenario())


def test_only_generation_requests_are_quarantined_not_the_model_list() -> None:
    async def scenario() -> None:
        worker = await ScriptedWorker("w", drop_models=True).start()
        async with (
            running_router(worker_url=(worker.url,)) as (r, url),
            aiohttp.ClientSession() as session,
        ):
            for _ in range(3):
                await wait_until(lambda: r.pool.get(worker.url).state == "ready")
                async with session.get(url + "/v1/models") as reply:
                    assert reply.status == 502  # failed, not retried, never quarantined
                    assert (await reply.json())["error"]["code"] == "upstream_failed"
            # every call reached the worker (aiohttp's client itself sends an idempotent GET
            # again, once, when a reused connection drops)
            assert 3 <= worker.models_asked <= 6
            assert metric(r, "radixserve_router_quarantined_requests_total") == 0
        await worker.stop()

    asyncio.run(scenario())


def test_a_stream_that_breaks_counts_as_a_death_with_its_request() -> None:
    async def scenario() -> None:
        worker = await ScriptedWorker("w", mode="break", events=1).start()
        async with (
            running_router(worker_url=(worker.url,)) as (r, url),
            aiohttp.ClientSession() as session,
        ):
            await wait_until(lambda: r.pool.ready())
            body = {**completion("a stream"), "stream": True}
            for _ in range(2):
                async with session.post(url + "/v1/completions", json=body) as reply:
                    assert reply.status == 200
                    assert b"upstream_disconnected" in await reply.read()
            async with session.post(url + "/v1/completions", json=body) as reply:
                assert reply.status == 400
                assert (await reply.json())["error"]["code"] == "request_quarantined"
            assert len(worker.requests) == 2
        await worker.stop()

    asyncio.run(scenario())


def test_a_body_nested_100k_deep_gets_400_not_a_traceback(caplog) -> None:
    async def scenario() -> None:
        worker = await ScriptedWorker("w").start()
        async with (
            running_router(worker_url=(worker.url,)) as (r, url),
            aiohttp.ClientSession() as session,
        ):
            await wait_until(lambda: r.pool.ready())
            depth = 100_000
            bodies = [
                b"[" * depth + b"]" * depth,
                b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}",
                b'{"messages": [' + b'{"a": ' * depth + b"1" + b"}" * depth + b"]}",
            ]
            for path in ("/v1/completions", "/v1/chat/completions", "/generate"):
                for data in bodies:
                    headers = {"Content-Type": "application/json"}
                    async with session.post(url + path, data=data, headers=headers) as reply:
                        assert reply.status == 400
                        error = (await reply.json())["error"]
                        assert error["type"] == "invalid_request_error"
                        assert error["code"] == "json_too_deep"
            assert worker.requests == []
            # Batches of token-id lists nested a little deeper than a batch are not a prompt:
            # the worker judges them, and the router does not recurse into them.
            shallow = {"model": "m", "prompt": [[[[1]]]], "max_tokens": 1}
            async with session.post(url + "/v1/completions", json=shallow) as reply:
                assert reply.status == 200
        await worker.stop()

    with caplog.at_level(logging.INFO):
        asyncio.run(scenario())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "RecursionError" not in caplog.text


async def _refusal_logs(session: aiohttp.ClientSession, url: str) -> None:
    async with session.get(url + "/v1/models%0a2026-12-03 12:00:00 router INFO forged%00") as r:
        assert r.status == 401
    # The server's parser refuses C0 controls in header values; the Unicode line separators
    # (NEL, LS) pass, and some log viewers break lines on them.
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Request-Id: "
        + "id\u2028forged\u0085x".encode()
        + b"\r\n"
        b"Connection: close\r\n\r\n"
    )
    assert (await reader.readline()).startswith(b"HTTP/1.1 401")
    writer.close()
    # a key that is not UTF-8 is a wrong key, not a crash
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\xff\r\n"
        b"X-Request-Id: \xfe\r\nConnection: close\r\n\r\n"
    )
    assert (await reader.readline()).startswith(b"HTTP/1.1 401")
    writer.close()


def test_client_paths_and_headers_reach_the_log_with_control_characters_escaped(caplog) -> None:
    async def scenario() -> None:
        async with (
            running_router(worker_url=("http://127.0.0.1:9",), api_key="k") as (_, url),
            aiohttp.ClientSession() as session,
        ):
            await _refusal_logs(session, url)

    with caplog.at_level(logging.INFO, logger="radixserve.router"):
        asyncio.run(scenario())
    lines = [
        logging.Formatter("%(name)s %(message)s").format(record)
        for record in caplog.records
        if "missing or wrong API key" in record.getMessage()
    ]
    assert len(lines) == 3, lines
    forged, escaped_header, not_utf8 = lines
    assert "request \\udcfe to /v1/models" in not_utf8
    assert "\n" not in forged and "\x00" not in forged
    assert "/v1/models\\n2026-12-03 12:00:00 router INFO forged\\x00" in forged
    assert "\u2028" not in escaped_header and "\x85" not in escaped_header
    assert "id\\u2028forged\\x85x" in escaped_header


def test_admin_calls_authenticate_before_any_side_effect() -> None:
    async def scenario() -> None:
        a, b = ScriptedWorker("a"), ScriptedWorker("b")
        for worker in (a, b):
            await worker.start()
        keys = {"api_key": "user-key", "admin_api_key": "admin-key"}
        async with (
            running_router(worker_url=(a.url, b.url), **keys) as (r, url),
            aiohttp.ClientSession() as session,
        ):
            await wait_until(lambda: len(r.pool.ready()) == 2)
            user = {"Authorization": "Bearer user-key"}
            admin = {"Authorization": "Bearer admin-key"}
            async with session.post(url + "/v1/completions", json=completion()) as reply:
                assert reply.status == 401  # the API key is asked for on the proxied paths
            async with session.post(
                url + "/v1/completions", json=completion(), headers=user
            ) as reply:
                assert reply.status == 200
            assert r.policy.tree.tenants()
            assert len(a.requests) + len(b.requests) == 1
            for headers in ({}, user, {"Authorization": "Bearer admin-keyX"}):
                async with session.post(url + "/flush_cache", headers=headers) as reply:
                    assert reply.status == 401
                    assert reply.headers["WWW-Authenticate"] == "Bearer"
                    assert (await reply.json())["error"]["code"] == "invalid_api_key"
                async with session.get(url + "/get_server_info", headers=headers) as reply:
                    assert reply.status == 401
                    text = await reply.text()
                    assert a.url not in text and b.url not in text
            assert r.policy.tree.tenants()  # nothing was wiped
            assert (a.flushed, b.flushed) == (0, 0)
            for path in ("/health", "/ready", "/metrics"):
                async with session.get(url + path) as reply:
                    assert reply.status == 200
            async with session.get(url + "/get_server_info", headers=admin) as reply:
                assert reply.status == 200
                assert len((await reply.json())["router"]["workers"]) == 2
            async with session.post(url + "/flush_cache", headers=admin) as reply:
                assert reply.status == 200
            assert (a.flushed, b.flushed) == (1, 1)
            assert r.policy.tree.tenants() == set()
        for worker in (a, b):
            await worker.stop()

    asyncio.run(scenario())


def test_without_a_key_of_its_own_the_router_honours_the_workers_refusal() -> None:
    async def scenario() -> None:
        a = await ScriptedWorker("a", admin_key="secret").start()
        async with (
            running_router(worker_url=(a.url,)) as (r, url),
            aiohttp.ClientSession() as session,
        ):
            await wait_until(lambda: r.pool.ready())
            async with session.post(url + "/v1/completions", json=completion()) as reply:
                assert reply.status == 200
            async with session.post(url + "/flush_cache") as reply:
                assert reply.status == 401
                assert (await reply.json())["error"]["code"] == "invalid_api_key"
            assert r.policy.tree.tenants() == {a.url}  # the tree kept what the worker kept
            async with session.get(url + "/get_server_info") as reply:
                assert reply.status == 401
                assert a.url not in await reply.text()
            secret = {"Authorization": "Bearer secret"}
            async with session.post(url + "/flush_cache", headers=secret) as reply:
                assert reply.status == 200
            assert r.policy.tree.tenants() == set()
        await a.stop()

    asyncio.run(scenario())


def test_a_hung_worker_cannot_hang_the_admin_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(router_server, "ADMIN_WORKER_TIMEOUT_S", 0.5)

    async def scenario() -> None:
        # the pool asks its workers in the order of their URLs: the hung one first
        low, high = sorted((free_port(), free_port()), key=lambda port: f"{port}")
        hung = ScriptedWorker("hung", hang_admin=True, port=low)
        fine = ScriptedWorker("fine", port=high)
        assert hung.url < fine.url
        for worker in (hung, fine):
            await worker.start()
        async with (
            running_router(worker_url=(hung.url, fine.url)) as (r, url),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        ):
            await wait_until(lambda: len(r.pool.ready()) == 2)
            for i in range(4):  # both workers hold part of the tree
                async with session.post(url + "/v1/completions", json=completion(f"p{i}")):
                    pass
            r.policy.tree.insert("only the hung one", hung.url)
            r.policy.tree.insert("only the fine one", fine.url)
            async with session.post(url + "/flush_cache") as reply:
                assert reply.status == 502
                error = (await reply.json())["error"]
            assert error["code"] == "flush_failed"
            assert hung.url in error["message"] and "timed out after 0.5s" in error["message"]
            assert fine.flushed == 1
            assert r.policy.tree.tenants() == {hung.url}  # the hung worker's part is kept
            async with session.get(url + "/get_server_info") as reply:
                assert reply.status == 200
                info = await reply.json()
            assert info["served_model_name"] == "fine"  # the next worker answered
            assert info["router"]["server_info_failed"] == {hung.url: "timed out after 0.5s"}
        for worker in (hung, fine):
            await worker.stop()

    asyncio.run(scenario())
