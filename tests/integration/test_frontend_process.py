"""The front end is its own light process: a running `radixserve serve` maps no libtorch in
the process that serves HTTP, while its scheduler child does (the check can fail)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest


def mapped_libraries(pid: int) -> set[str]:
    names = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and ".so" in parts[5]:
            names.add(Path(parts[5]).name)
    return names


def test_the_http_process_maps_no_torch_and_its_scheduler_does(api_server, api_client):
    # a request first: tokenizing and detokenizing must not pull torch in either
    api_client.completions.create(
        model=api_client.models.list().data[0].id, prompt="Hi", max_tokens=2
    )
    front = api_server.process.pid
    front_libraries = mapped_libraries(front)
    assert front_libraries, "no shared libraries read from /proc: the check would prove nothing"
    assert not [name for name in front_libraries if name.startswith("libtorch")]
    scheduler_maps = [mapped_libraries(child) for child in api_server.child_pids()]
    assert any(name.startswith("libtorch") for libraries in scheduler_maps for name in libraries), (
        "the scheduler child should map libtorch"
    )


def _health_latencies_during(api_server, body: bytes, api_key: str) -> tuple[int, list[float]]:
    """POST `body` to /v1/completions while polling /health; (its status, /health latencies)."""
    result: dict[str, int] = {}

    def post() -> None:
        request = urllib.request.Request(
            api_server.base_url + "/v1/completions",
            data=body,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                result["status"] = response.status
        except urllib.error.HTTPError as error:
            result["status"] = error.code

    sender = threading.Thread(target=post)
    latencies = []
    sender.start()
    while sender.is_alive():
        started = time.perf_counter()
        status, _ = api_server.get("/health", timeout=30)
        latencies.append(time.perf_counter() - started)
        assert status == 200
        time.sleep(0.02)
    sender.join()
    return result["status"], latencies


@pytest.mark.parametrize(
    ("chars", "what"),
    [(60_000_000, "refused untokenized"), (1_000_000, "tokenized off the loop, then too long")],
)
def test_health_answers_while_a_huge_prompt_arrives(api_server, api_keys, chars, what):
    """Tokenizing a 20 MB prompt on the event loop once froze /health for 25-35 s."""
    prompt = ("hello world " * (chars // 12 + 1))[:chars]
    body = json.dumps({"model": "smollm2-135m", "prompt": prompt, "max_tokens": 1}).encode()
    status, latencies = _health_latencies_during(api_server, body, api_keys[0])
    assert status == 400, what
    print(f"{what}: {len(latencies)} /health probes, max {max(latencies) * 1000:.0f} ms")
    # the old front end blocked for tens of seconds; a free loop answers in milliseconds
    assert max(latencies) < 1.0
