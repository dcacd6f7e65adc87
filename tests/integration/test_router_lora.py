"""LoRA adapter affinity in the router, two scripted workers: requests for an adapter go to the
worker whose radixserve_lora_requests_info lists it (>= 90%, all of them here) while its load
allows; an adapter no worker has goes by load and then stays where it went; a holder far busier
than the other worker loses the adapter's requests; the base model's name is no adapter."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from router_harness import ScriptedWorker, running_router, wait_until


def lora_gauge(running: str, waiting: str = "") -> str:
    return (
        "# TYPE radixserve_lora_requests_info gauge\n"
        f'radixserve_lora_requests_info{{model_name="m",running_lora_adapters="{running}",'
        f'waiting_lora_adapters="{waiting}",max_lora="4"}} {time.time()}\n'
    )


async def send(url: str, model: str, n: int) -> None:
    async with aiohttp.ClientSession() as session:
        for i in range(n):
            body = {"model": model, "prompt": f"request {i} {model}", "max_tokens": 2}
            async with session.post(url + "/v1/completions", json=body) as reply:
                assert reply.status == 200, await reply.text()
                await reply.read()


def count(worker: ScriptedWorker, model: str) -> int:
    return sum(1 for r in worker.requests if r.get("model") == model)


def test_adapter_requests_go_to_the_worker_that_has_the_adapter() -> None:
    async def scenario() -> None:
        holder = await ScriptedWorker("a", extra_metrics=lora_gauge("sql,chat")).start()
        other = await ScriptedWorker("b", extra_metrics=lora_gauge("", "poet")).start()
        try:
            async with running_router(worker_url=(holder.url, other.url)) as (router, url):
                await wait_until(lambda: len(router.pool.ready()) == 2 and router.lora.active)
                await wait_until(lambda: all(u.lora_adapters for u in router.pool.ready()))
                await send(url, "sql", 30)
                assert count(holder, "sql") >= 27  # >= 90% (every one, with equal loads)
                await send(url, "poet", 10)
                assert count(other, "poet") == 10
                # an adapter nobody has: placed by load, then it stays with that worker
                await send(url, "fresh", 12)
                assert sorted([count(holder, "fresh"), count(other, "fresh")]) == [0, 12]
                # the base model's name (from /v1/models) is not an adapter
                assert router.lora.base_models == {"a", "b"} and not router.lora.is_adapter("a")
                # the holder far busier than the other worker: its adapter's requests go there
                holder.queued = 500.0
                await wait_until(lambda: router.pool.get(holder.url).load >= 500)
                before = count(other, "sql")
                await send(url, "sql", 5)
                assert count(other, "sql") - before == 5
        finally:
            await holder.stop()
            await other.stop()

    asyncio.run(scenario())
