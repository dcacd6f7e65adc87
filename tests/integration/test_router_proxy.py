"""The router's HTTP behaviour against scripted workers: pass-through, retries, failover, holds.

Every case runs a real router app in-process on a loopback port and stand-in workers that
answer as scripted (`router_harness.ScriptedWorker`), so each failure mode happens exactly
when the test wants it.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
from router_harness import ScriptedWorker, read_events, running_router, wait_until


def metric(router, name: str, **labels: str) -> float:
    value = router.metrics.registry.get_sample_value(name, {"model_name": "m", **labels})
    return 0.0 if value is None else value


async def start(*workers: ScriptedWorker) -> list[ScriptedWorker]:
    return [await worker.start() for worker in workers]


async def stop(*workers: ScriptedWorker) -> None:
    for worker in workers:
        await worker.stop()


def completion(stream: bool = False, prompt: str = "hello") -> dict:
    return {"model": "m", "prompt": prompt, "max_tokens": 4, "stream": stream}


def test_a_workers_error_reaches_the_client_unchanged() -> None:
    async def scenario() -> None:
        (worker,) = await start(ScriptedWorker("w", mode="status", status=400))
        async with running_router(worker_url=(worker.url,)) as (router, url):
            await wait_until(lambda: router.pool.ready())
            async with aiohttp.ClientSession() as session:
                async with session.post(url + "/v1/completions", json=completion()) as reply:
                    assert reply.status == 400
                    assert reply.headers["Retry-After"] == "7"
                    assert await reply.json() == {
                        "error": {
                            "message": "w says 400",
                            "type": "invalid_request_error",
                            "param": None,
                            "code": "code_400",
                        }
                    }
                assert len(worker.requests) == 1  # a 400 is final: no retry
                assert metric(router, "radixserve_router_retries_total") == 0
                async with session.get(url + "/nope") as reply:
                    assert reply.status == 404
                    assert (await reply.json())["error"]["code"] == "not_found"
        await stop(worker)

    asyncio.run(scenario())


def test_429_and_503_are_retried_elsewhere_and_the_last_refusal_is_returned() -> None:
    async def scenario() -> None:
        busy = ScriptedWorker("busy", mode="status", status=429)
        draining = ScriptedWorker("draining", mode="status", status=503, code="draining")
        fine = ScriptedWorker("fine")
        await start(busy, draining, fine)
        urls = (busy.url, draining.url, fine.url)
        # One probe at start, then none: only the answers themselves can take a worker out.
        async with running_router(
            worker_url=urls, policy="round_robin", health_check_interval=3600
        ) as (router, url):
            await wait_until(lambda: len(router.pool.ready()) == 3)
            draining.ready = False  # it started draining after the probe
            async with aiohttp.ClientSession() as session:
                for _ in range(8):  # round robin reaches every worker within a few requests
                    async with session.post(url + "/v1/completions", json=completion()) as reply:
                        assert reply.status == 200
                        assert (await reply.json())["worker"] == "fine"
                # The draining worker's 503 took it out at once: it got one request, no more.
                assert router.pool.get(draining.url).state == "not_ready"
                assert len(draining.requests) == 1 and busy.requests
                assert metric(router, "radixserve_router_retries_total") >= 2
                errors = "radixserve_router_upstream_errors_total"
                assert metric(router, errors, worker=busy.url, kind="status_429") >= 1
                assert metric(router, errors, worker=draining.url, kind="status_503") == 1
                await fine.stop()  # now every worker left refuses: the client gets the 429
                async with session.post(url + "/v1/completions", json=completion()) as reply:
                    assert reply.status == 429
                    assert reply.headers["Retry-After"] == "7"
                    assert (await reply.json())["error"]["message"] == "busy says 429"
        await stop(busy, draining)

    asyncio.run(scenario())


def test_an_unreachable_worker_is_taken_out_and_the_request_retried() -> None:
    async def scenario() -> None:
        dead, alive = ScriptedWorker("dead"), ScriptedWorker("alive")
        await start(alive)  # `dead` never listens
        # Probes are rare here, so only the requests themselves can find out.
        async with running_router(
            worker_url=(dead.url, alive.url), policy="round_robin", health_check_interval=3600
        ) as (router, url):
            await wait_until(lambda: router.pool.get(dead.url).state == "down")  # first probe
            await wait_until(lambda: router.pool.get(alive.url).state == "ready")
            router.pool.set_state(router.pool.get(dead.url), "ready")  # as if it just died
            async with aiohttp.ClientSession() as session:
                for _ in range(4):
                    async with session.post(url + "/v1/completions", json=completion()) as reply:
                        assert reply.status == 200
            assert router.pool.get(dead.url).state == "down"
            assert metric(router, "radixserve_router_retries_total") == 1
            errors = "radixserve_router_upstream_errors_total"
            assert metric(router, errors, worker=dead.url, kind="connect") == 1
            assert len(alive.requests) == 4
        await stop(alive)

    asyncio.run(scenario())


def test_a_stream_that_breaks_midway_ends_with_an_error_event() -> None:
    async def scenario() -> None:
        (worker,) = await start(ScriptedWorker("w", mode="break", events=3))
        async with running_router(worker_url=(worker.url,)) as (router, url):
            await wait_until(lambda: router.pool.ready())
            async with (
                aiohttp.ClientSession() as session,
                session.post(url + "/v1/completions", json=completion(True)) as reply,
            ):
                assert reply.status == 200
                assert reply.headers["X-Radixserve-Worker"] == worker.url
                events = await read_events(reply)
            assert [e["i"] for e in events[:3]] == [0, 1, 2]  # the half event never arrives
            assert events[3]["error"]["code"] == "upstream_disconnected"
            assert events[3]["error"]["type"] == "server_error"
            assert events[4:] == ["[DONE]"]
            errors = "radixserve_router_upstream_errors_total"
            assert metric(router, errors, worker=worker.url, kind="stream_broken") == 1
        await stop(worker)

    asyncio.run(scenario())


def test_a_stream_that_ends_without_done_is_not_passed_off_as_complete() -> None:
    async def scenario() -> None:
        (worker,) = await start(ScriptedWorker("w", mode="truncate", events=2))
        async with running_router(worker_url=(worker.url,)) as (router, url):
            await wait_until(lambda: router.pool.ready())
            async with (
                aiohttp.ClientSession() as session,
                session.post(url + "/v1/completions", json=completion(True)) as reply,
            ):
                events = await read_events(reply)
            assert [e["i"] for e in events[:2]] == [0, 1]
            assert events[2]["error"]["code"] == "upstream_disconnected"
            assert events[3:] == ["[DONE]"]
        await stop(worker)

    asyncio.run(scenario())


def test_a_client_that_goes_away_aborts_its_upstream_request() -> None:
    async def scenario() -> None:
        (worker,) = await start(ScriptedWorker("w", mode="hang", events=1))
        async with running_router(worker_url=(worker.url,)) as (router, url):
            await wait_until(lambda: router.pool.ready())
            async with aiohttp.ClientSession() as session:
                reply = await session.post(url + "/v1/completions", json=completion(True))
                assert (await reply.content.readline()).startswith(b"data: {")
                reply.close()  # the client hangs up mid-stream
            await wait_until(lambda: worker.aborted == 1)
            await wait_until(lambda: router.pool.get(worker.url).in_flight == 0)
        await stop(worker)

    asyncio.run(scenario())


def test_with_no_ready_worker_requests_wait_then_are_served() -> None:
    async def scenario() -> None:
        worker = ScriptedWorker("late", ready=False)
        await start(worker)
        async with (
            running_router(worker_url=(worker.url,), pending_timeout=30) as (router, url),
            aiohttp.ClientSession() as session,
        ):
            async with session.get(url + "/ready") as reply:
                assert reply.status == 503
            async with session.get(url + "/health") as reply:
                assert reply.status == 200

            async def ask() -> int:
                async with session.post(url + "/v1/completions", json=completion()) as reply:
                    return reply.status

            waiting = [asyncio.create_task(ask()) for _ in range(3)]
            await wait_until(lambda: router.pool.pending == 3)
            assert metric(router, "radixserve_router_pending_requests") == 3
            worker.ready = True  # the autoscaler's new worker passes its probe
            assert await asyncio.gather(*waiting) == [200, 200, 200]
            assert metric(router, "radixserve_router_pending_requests") == 0
            async with session.get(url + "/ready") as reply:
                assert reply.status == 200
        await stop(worker)

    asyncio.run(scenario())


def test_the_wait_ends_in_503_with_retry_after_at_the_timeout_or_a_full_queue() -> None:
    async def scenario() -> None:
        async with (
            running_router(
                worker_url=("http://127.0.0.1:9",), pending_timeout=0.5, max_pending=1
            ) as (router, url),
            aiohttp.ClientSession() as session,
        ):
            started = time.monotonic()
            first = asyncio.create_task(session.post(url + "/v1/completions", json=completion()))
            await wait_until(lambda: router.pool.pending == 1)
            async with session.post(url + "/v1/completions", json=completion()) as full:
                assert full.status == 503
                assert (await full.json())["error"]["code"] == "pending_queue_full"
            reply = await first
            assert reply.status == 503 and reply.headers["Retry-After"] == "1"
            body = await reply.json()
            assert body["error"]["code"] == "no_ready_worker"
            assert "0.5s" in body["error"]["message"]
            assert 0.5 <= time.monotonic() - started < 5
            reply.release()

    asyncio.run(scenario())


def test_flush_and_server_info_cover_the_fleet() -> None:
    async def scenario() -> None:
        a, b = await start(ScriptedWorker("a"), ScriptedWorker("b"))
        async with running_router(worker_url=(a.url, b.url)) as (router, url):
            await wait_until(lambda: len(router.pool.ready()) == 2)
            async with aiohttp.ClientSession() as session:
                async with session.post(url + "/v1/completions", json=completion()) as reply:
                    assert reply.status == 200
                assert router.policy.tree.tenants()
                async with session.post(url + "/flush_cache") as reply:
                    assert reply.status == 200
                    assert (await reply.json())["workers"] == {a.url: "ok", b.url: "ok"}
                assert (a.flushed, b.flushed) == (1, 1)
                assert router.policy.tree.tenants() == set()  # the caches are empty now
                async with session.get(url + "/get_server_info") as reply:
                    info = await reply.json()
                assert info["served_model_name"] in ("a", "b")
                assert info["router"]["policy"] == "cache_aware"
                assert {w["url"] for w in info["router"]["workers"]} == {a.url, b.url}
                async with session.get(url + "/v1/models") as reply:
                    assert (await reply.json())["data"][0]["id"] in ("a", "b")
        await stop(a, b)

    asyncio.run(scenario())


def test_queue_gauges_steer_load_away_from_a_worker_busy_with_others_requests() -> None:
    async def scenario() -> None:
        busy, idle = ScriptedWorker("busy", queued=50), ScriptedWorker("idle")
        await start(busy, idle)
        async with running_router(worker_url=(busy.url, idle.url)) as (router, url):
            await wait_until(lambda: router.pool.get(busy.url).load == 50)
            async with aiohttp.ClientSession() as session:
                for i in range(4):
                    body = completion(prompt=f"a fresh prompt {i} " * 10)
                    async with session.post(url + "/v1/completions", json=body) as reply:
                        assert (await reply.json())["worker"] == "idle"
            assert (
                metric(
                    router, "radixserve_router_requests_total", worker=idle.url, decision="balance"
                )
                == 4
            )
        await stop(busy, idle)

    asyncio.run(scenario())
