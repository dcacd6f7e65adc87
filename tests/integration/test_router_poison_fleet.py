"""One poison request against a fleet: a real `radixserve router` process in front of two
scripted workers in their own processes, each of which exits the moment it receives the poison.

The router must not spread it: the worker that got it dies, the other never sees it, the client
gets an error (not a hang), the fleet keeps serving; after the first worker is restarted and dies
of the same request again, that request is quarantined (400) without reaching any worker.
The last test holds the router to the real worker's answer when its scheduler dies under a
request (bundled SmolLM2 on the CPU: slow).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from router_harness import free_port

from radixserve.bench.router import metric_sum, started_workers
from radixserve.bench.server_process import ServerProcess

HARNESS = Path(__file__).with_name("router_harness.py")
POISON = "POISON-PILL"
CLIENT_TIMEOUT_S = 60.0  # an answer must come; a hang fails here


class WorkerProcess:
    def __init__(self, name: str, port: int, record: Path) -> None:
        self.name, self.port, self.record = name, port, record
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        command = [sys.executable, str(HARNESS), "--port", str(self.port), "--name", self.name]
        command += ["--poison", POISON, "--record", str(self.record)]
        self.process = subprocess.Popen(command)
        deadline = time.monotonic() + 60
        while not self.alive_and_ready():
            assert self.process.poll() is None, "the scripted worker exited at start"
            assert time.monotonic() < deadline, "the scripted worker did not start"
            time.sleep(0.1)
        return self

    def alive_and_ready(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            return False
        with contextlib.suppress(OSError):
            return call("GET", self.url + "/ready", timeout=2)[0] == 200
        return False

    def prompts(self) -> list[str]:
        if not self.record.exists():
            return []
        return [json.loads(line)["prompt"] for line in self.record.read_text().splitlines()]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


def call(
    method: str, url: str, body: dict | None = None, timeout: float = CLIENT_TIMEOUT_S
) -> tuple[int, dict, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, dict(reply.headers), json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read() or b"{}")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[ServerProcess, list[WorkerProcess]]]:
    workers = [WorkerProcess(n, free_port(), tmp_path / f"{n}.jsonl") for n in ("a", "b")]
    try:
        for worker in workers:
            worker.start()
        args = [arg for w in workers for arg in ("--worker-url", w.url)]
        args += ["--health-check-interval", "0.2", "--model-name", "m"]
        with ServerProcess(args, tmp_path / "router.log", subcommand="router") as router:
            router.log_path = tmp_path / "router.log"  # type: ignore[attr-defined]
            yield router, workers
    finally:
        for worker in workers:
            worker.stop()


def completion(prompt: str) -> dict:
    return {"model": "m", "prompt": prompt, "max_tokens": 4}


def worker_states(router: ServerProcess) -> dict[str, str]:
    status, body = router.get("/get_server_info")
    assert status == 200
    return {w["url"]: w["state"] for w in json.loads(body)["router"]["workers"]}


def wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def metric(router: ServerProcess, name: str) -> float:
    status, body = router.get("/metrics")
    assert status == 200
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.decode().splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def test_a_poison_request_kills_one_worker_not_the_fleet_and_is_quarantined(fleet) -> None:
    router, workers = fleet
    base = router.base_url
    poison = completion(f"Summarize this: {POISON}")

    status, _, reply = call("POST", base + "/v1/completions", completion("warm up"))
    assert status == 200

    # 1. The poison kills the worker that receives it. The client gets an error at once.
    status, headers, reply = call("POST", base + "/v1/completions", poison)
    assert status == 502 and reply["error"]["code"] == "upstream_failed"
    victim = next(w for w in workers if w.url == headers["X-Radixserve-Worker"])
    survivor = next(w for w in workers if w is not victim)
    assert victim.process is not None and victim.process.wait(timeout=30) == 17
    assert survivor.alive_and_ready()
    assert poison["prompt"] in victim.prompts() and poison["prompt"] not in survivor.prompts()
    assert metric(router, "radixserve_router_retries_total") == 0

    # 2. The fleet serves everything else on the survivor.
    for i in range(4):
        status, headers, reply = call("POST", base + "/v1/completions", completion(f"ok {i}"))
        assert status == 200 and headers["X-Radixserve-Worker"] == survivor.url

    # 3. The victim comes back; the same request goes to it again (it holds the prompt's
    # prefix) and kills it again: the second coincident death.
    victim.start()
    wait_for(lambda: worker_states(router)[victim.url] == "ready", "the router saw no restart")
    status, headers, reply = call("POST", base + "/v1/completions", poison)
    assert status == 502 and headers["X-Radixserve-Worker"] == victim.url
    assert victim.process is not None and victim.process.wait(timeout=30) == 17
    assert victim.prompts().count(poison["prompt"]) == 2

    # 4. Quarantined: refused by the router, with every worker up, without reaching any.
    victim.start()
    wait_for(lambda: set(worker_states(router).values()) == {"ready"}, "not both ready")
    status, headers, reply = call("POST", base + "/v1/completions", poison)
    assert status == 400 and reply["error"]["code"] == "request_quarantined"
    assert "X-Radixserve-Worker" not in headers
    assert victim.alive_and_ready() and survivor.alive_and_ready()
    assert victim.prompts().count(poison["prompt"]) == 2
    assert poison["prompt"] not in survivor.prompts()
    assert metric(router, "radixserve_router_quarantined_requests_total") == 1

    # 5. Normal requests still succeed.
    for i in range(4):
        status, _, reply = call("POST", base + "/v1/completions", completion(f"after {i}"))
        assert status == 200
    log = router.log_path.read_text()  # type: ignore[attr-defined]
    assert log.count("coincided with two worker failures") == 1


REAL_SERVE_ARGS = ["--device", "cpu", "--max-running-requests", "4", "--max-total-tokens", "4096"]


@pytest.mark.slow
def test_a_real_worker_whose_scheduler_dies_mid_request_does_not_pass_it_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two `radixserve serve` workers (bundled SmolLM2, CPU): the scheduler of the worker running
    a request is SIGKILLed. The worker's own answer (503 `unavailable`) reaches the client, the
    other worker never runs the request, and the fleet goes on serving."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two workers share two cores
    long = {"model": "smollm2-135m", "prompt": "Tell me a long story.", "max_tokens": 2000}
    long |= {"ignore_eos": True}
    with started_workers(2, REAL_SERVE_ARGS, tmp_path) as workers:
        args = [arg for w in workers for arg in ("--worker-url", w.base_url)]
        args += ["--health-check-interval", "0.2"]
        with ServerProcess(args, tmp_path / "router.log", subcommand="router") as router:

            def running(worker: ServerProcess) -> float:
                _, body = worker.get("/metrics")
                return metric_sum(body.decode(), "radixserve_num_running_requests")

            with ThreadPoolExecutor(1) as pool:
                asked = pool.submit(call, "POST", router.base_url + "/v1/completions", long)
                wait_for(lambda: any(running(w) for w in workers), "the request never ran", 120)
                victim = next(w for w in workers if running(w))
                survivor = next(w for w in workers if w is not victim)
                finished_before = metric_sum(
                    survivor.get("/metrics")[1].decode(), "radixserve_requests_total"
                )
                for (
                    pid
                ) in victim.child_pids():  # the scheduler (and its helpers), not the front end
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                status, headers, reply = asked.result(timeout=CLIENT_TIMEOUT_S)
            assert status == 503 and reply["error"]["code"] == "unavailable", reply
            assert headers["X-Radixserve-Worker"] == victim.base_url
            assert running(survivor) == 0
            assert metric(router, "radixserve_router_retries_total") == 0
            for i in range(3):
                small = {"model": "smollm2-135m", "prompt": f"Say {i}.", "max_tokens": 2}
                status, headers, _ = call("POST", router.base_url + "/v1/completions", small)
                assert status == 200 and headers["X-Radixserve-Worker"] == survivor.base_url
            finished_after = metric_sum(
                survivor.get("/metrics")[1].decode(), "radixserve_requests_total"
            )
            assert finished_after == finished_before + 3  # the three small ones, not the long one
