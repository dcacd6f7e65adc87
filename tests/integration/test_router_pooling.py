"""The router in front of embedding and reranking workers: `/v1/embeddings`, `/v1/rerank` and
`/v1/score` reach a worker with the body as sent and come back unchanged (the worker's 400s
too), and every rerank of one query goes to the worker that has the query cached."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from aiohttp import web
from router_harness import free_port, running_router

PATHS = ("/v1/embeddings", "/v1/rerank", "/v1/score")
METRICS = (
    "# TYPE radixserve_num_queued_requests gauge\n"
    'radixserve_num_queued_requests{model_name="m"} 0.0\n'
    "# TYPE radixserve_num_running_requests gauge\n"
    'radixserve_num_running_requests{model_name="m"} 0.0\n'
)


@asynccontextmanager
async def pooling_worker(name: str, seen: list[tuple[str, str, dict]]) -> AsyncIterator[str]:
    """A worker that answers the pooling paths with what it got; `bad` in a body is a 400."""

    async def pool(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append((name, request.path, body))
        if "bad" in body:
            error = {"message": "input is empty", "type": "invalid_request_error"}
            return web.json_response({"error": {**error, "param": "input"}}, status=400)
        return web.json_response({"worker": name, "path": request.path, "body": body})

    app = web.Application()
    app.router.add_get("/ready", lambda r: web.json_response({"status": "ready"}))
    app.router.add_get("/health", lambda r: web.json_response({"status": "ok"}))
    app.router.add_get("/metrics", lambda r: web.Response(text=METRICS))
    for path in PATHS:
        app.router.add_post(path, pool)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def test_pooling_paths_reach_a_worker_and_a_query_stays_on_one() -> None:
    async def scenario() -> None:
        seen: list[tuple[str, str, dict]] = []
        async with (
            pooling_worker("a", seen) as a,
            pooling_worker("b", seen) as b,
            running_router(worker_url=(a, b)) as (router, url),
            aiohttp.ClientSession() as session,
        ):
            await asyncio.sleep(0.2)  # both probed ready
            bodies = {
                "/v1/embeddings": {"input": ["x y", "z"], "encoding_format": "base64"},
                "/v1/rerank": {"query": "which cat?", "documents": ["a", "b"], "top_n": 1},
                "/v1/score": {"text_1": "which cat?", "text_2": ["a"]},
            }
            for path, body in bodies.items():
                async with session.post(url + path, json=body) as reply:
                    assert reply.status == 200
                    answer = await reply.json()
                    assert (answer["path"], answer["body"]) == (path, body)
                    assert reply.headers["X-Radixserve-Worker"] in (a, b)
            # two queries, interleaved: each stays on the worker that has it cached, and the
            # second goes to the worker holding less (cache_aware)
            queries = {
                q: set() for q in ("which cat sat on the mat? " * 4, "why is the sky blue? " * 4)
            }
            for i in range(4):
                for query, workers in queries.items():
                    body = {"query": query, "documents": [f"doc {i}"]}
                    async with session.post(url + "/v1/rerank", json=body) as reply:
                        workers.add(reply.headers["X-Radixserve-Worker"])
            first, second = queries.values()
            assert len(first) == len(second) == 1 and first != second
            async with session.post(url + "/v1/embeddings", json={"bad": 1}) as reply:
                assert reply.status == 400
                assert (await reply.json())["error"]["param"] == "input"

    asyncio.run(scenario())
