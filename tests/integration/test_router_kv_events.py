"""`radixserve router --prefix-source events` over two real workers publishing KV events.

The worker's `POST /tokenize` gives a chat exactly the ids generation uses (its count is the
usage's prompt_tokens). The router finds each worker's events endpoint in its server info,
follows what each caches, and sends a conversation's next turn to the worker whose KV events
hold its prefix (decision `prefix`); once that worker's cache is flushed, the events say so and
the same turn is routed by load instead."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from router_harness import routing_decisions

from radixserve.bench.router import started_router, started_workers

pytestmark = pytest.mark.slow

SYSTEM = "You are a careful assistant who answers about volcanoes. " * 12


def post(url: str, path: str, body: dict) -> tuple[dict, dict]:
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read()), dict(reply.headers)


def test_events_route_a_conversation_to_the_worker_that_holds_it(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    serve_args = ["--device", "cpu", "--max-running-requests", "2"]
    serve_args += ["--max-total-tokens", "4096"]
    with started_workers(2, serve_args, tmp_path, kv_events=True) as workers:
        urls = [w.base_url for w in workers]
        with urllib.request.urlopen(urls[0] + "/v1/models", timeout=10) as reply:
            model = json.loads(reply.read())["data"][0]["id"]
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Etna?"}]
        chat = {"model": model, "messages": messages, "max_tokens": 2, "temperature": 0}
        tokens, _ = post(urls[0], "/tokenize", chat)
        reply, _ = post(urls[0], "/v1/chat/completions", chat)
        assert tokens["count"] == len(tokens["tokens"]) == reply["usage"]["prompt_tokens"]
        post(urls[0], "/flush_cache", {})

        args = ["--policy", "cache_aware", "--prefix-source", "events"]
        args += ["--health-check-interval", "0.3", "--balance-abs-threshold", "100"]
        with started_router(urls, args, tmp_path / "router.log") as router:
            time.sleep(1.5)  # the router has subscribed to both workers
            _, headers = post(router.base_url, "/v1/chat/completions", chat)
            first = headers["X-Radixserve-Worker"]
            assert routing_decisions(router) == {"least_loaded": 1}
            time.sleep(0.5)  # its KV events reach the router
            follow_up = {**chat, "messages": [*messages, {"role": "user", "content": "Fuji?"}]}
            _, headers = post(router.base_url, "/v1/chat/completions", follow_up)
            assert headers["X-Radixserve-Worker"] == first
            assert routing_decisions(router).get("prefix") == 1
            status, body = router.get("/get_server_info")
            events = json.loads(body)["router"]["kv_events"]
            assert status == 200 and events["gaps"] == 0 and events["blocks"][first] > 0

            post(first, "/flush_cache", {})  # behind the router's back: only events tell
            time.sleep(0.5)
            post(router.base_url, "/v1/chat/completions", follow_up)
            assert routing_decisions(router).get("prefix") == 1  # not routed by a prefix any more
            assert routing_decisions(router).get("least_loaded") == 2
