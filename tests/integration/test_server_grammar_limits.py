"""Pathological grammars on the real server (the bundled SmolLM2 on the CPU, with a short
--grammar-compile-timeout): a huge enum whose client gave up is killed, one whose client waits
gets a 400 naming the schema once the limit passes, and meanwhile a simple json_schema request
and a plain one are served as if nothing were compiling.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

pytestmark = pytest.mark.slow

TIMEOUT_S = 6
# compiles for far longer than TIMEOUT_S (a 20k-value enum takes ~4 s on one core)
ENUM_VALUES = 60_000


def huge_enum(tag: str) -> str:
    return json.dumps({"enum": [f"{tag}-{i:06d}-{i * 7919 % 100_003}" for i in range(ENUM_VALUES)]})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from radixserve.bench.server_process import ServerProcess

    log = tmp_path_factory.mktemp("grammar_limits") / "server.log"
    args = ["--max-total-tokens", "4096", "--grammar-compile-timeout", str(TIMEOUT_S)]
    with ServerProcess(args, log_path=log) as proc:
        yield proc
    assert proc.process.returncode == 0, log.read_text()[-3000:]


async def generate(session, server, sampling_params: dict) -> tuple[int, dict, float]:
    start = time.monotonic()
    body = {"text": "A JSON value:", "sampling_params": {"temperature": 0, **sampling_params}}
    async with session.post(server.base_url + "/generate", json=body) as reply:
        return reply.status, await reply.json(), time.monotonic() - start


def server_info(server) -> dict:
    status, body = server.get("/get_server_info")
    assert status == 200
    return json.loads(body)


async def until(server, condition, timeout: float = 60.0) -> dict:
    """Server info once `condition(info)` holds."""
    deadline = time.monotonic() + timeout
    while not condition(info := await asyncio.to_thread(server_info, server)):
        assert time.monotonic() < deadline, {k: v for k, v in info.items() if "grammar" in k}
        await asyncio.sleep(0.05)
    return info


async def scenario(server) -> dict:
    async with aiohttp.ClientSession() as session:
        # a client that gives up on its pathological schema: its compile is stopped
        gone = asyncio.create_task(generate(session, server, {"json_schema": huge_enum("gone")}))
        await until(server, lambda info: info["grammar_compiles_running"] == 1)
        gone.cancel()
        cancelled = await until(
            server,
            lambda info: (
                info["grammar_compiles_cancelled"] == 1 and info["grammar_compiles_running"] == 0
            ),
            timeout=10,
        )
        # one that waits for it: a 400 once the compile has run for TIMEOUT_S
        waits = asyncio.create_task(
            generate(session, server, {"json_schema": huge_enum("waits"), "max_new_tokens": 4})
        )
        await until(server, lambda info: info["grammar_compiles_running"] == 1)
        simple = await generate(
            session, server, {"json_schema": '{"type": "object"}', "max_new_tokens": 16}
        )
        plain = await generate(session, server, {"max_new_tokens": 16})
        still_compiling = not waits.done()
        return {
            "simple": simple,
            "plain": plain,
            "still_compiling": still_compiling,
            "cancelled": cancelled,
            "waits": await waits,
        }


def test_a_pathological_schema_neither_holds_the_server_nor_outlives_its_limit(server):
    before = server_info(server)
    assert before["grammar_compiles_running"] == 0
    start = time.monotonic()
    results = asyncio.run(scenario(server))
    # the gone client's abort stopped its compile within seconds (it would run for far longer)
    assert results["cancelled"]["num_compiling_grammars"] == 0

    status, reply, took = results["simple"]
    assert status == 200 and reply["text"].startswith("{"), reply
    status, reply, _ = results["plain"]
    assert status == 200 and reply["meta_info"]["completion_tokens"] == 16
    # both served while the waiting client's pathological compile still ran
    assert results["still_compiling"]

    status, reply, took = results["waits"]
    assert status == 400, reply
    assert reply["error"]["param"] == "sampling_params.json_schema"
    message = reply["error"]["message"]
    assert f"the grammar took longer than {TIMEOUT_S} s to compile" in message, message
    assert TIMEOUT_S <= took < TIMEOUT_S + 30, took
    assert time.monotonic() - start < 120

    after = server_info(server)
    assert after["grammar_compiles_running"] == 0 and after["num_compiling_grammars"] == 0
    assert after["grammar_compiles_timed_out"] == 1
    assert after["grammar_compiles_cancelled"] == 1
    assert after["grammar_cache_bytes"] > 0  # the simple schema's grammar
