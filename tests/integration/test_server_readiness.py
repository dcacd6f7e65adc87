"""Readiness and the metrics an autoscaler reads, on a real server process.

/ready follows the scheduler loop's liveness (its steps and its idle heartbeat), not the queue:
a saturated pod stays ready, a stopped scheduler does not. Nothing probes the engine, so an idle
server's batch metrics stay untouched. KV usage counts only what requests hold: after a burst it
falls back to 0 while the prefixes stay cached (evictable) and are hit again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import pytest

from radixserve import read_ahead
from radixserve.bench.server_process import ServerProcess

pytestmark = pytest.mark.slow

STALL_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def startup_cache(tmp_path_factory) -> Path:
    """A worker cache whose start-up record (read_ahead.py) lists one small file, as if the
    last start had read only that."""
    cache = tmp_path_factory.mktemp("cache")
    sentinel = cache / "sentinel.bin"
    sentinel.write_bytes(b"x" * 40960)
    with mock.patch.dict(os.environ, {"RADIXSERVE_CACHE_DIR": str(cache)}):
        record = read_ahead.startup_record_path()
    record.parent.mkdir(parents=True)
    now = sentinel.stat()
    entry = {"path": str(sentinel), "size": now.st_size, "mtime_ns": now.st_mtime_ns}
    files = [{**entry, "ranges": [[0, now.st_size]]}]
    record.write_text(json.dumps({"version": read_ahead.RECORD_VERSION, "files": files}))
    return cache


@pytest.fixture(scope="module")
def server(tmp_path_factory, startup_cache):
    args = ["--model", "random:tiny-llama", "--max-total-tokens", "4096"]
    args += ["--max-running-requests", "2", "--max-queued-requests", "6"]
    args += ["--scheduler-stall-timeout", str(STALL_TIMEOUT_S)]
    log = tmp_path_factory.mktemp("readiness") / "server.log"
    env = {**os.environ, "RADIXSERVE_CACHE_DIR": str(startup_cache)}
    with ServerProcess(args, log_path=log, env=env) as server:
        server.log_path = log
        yield server


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    """The value of one series in /metrics (summed over the series that match the labels)."""
    text = server.get("/metrics")[1].decode()
    total, found = 0.0, False
    for line in text.splitlines():
        match = re.match(rf"{name}(\{{[^}}]*\}})? (\S+)$", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            total, found = total + float(match.group(2)), True
    assert found, f"{name} {labels} not exported"
    return total


def generate(server: ServerProcess, input_ids: list[int], max_new_tokens: int) -> tuple[int, dict]:
    body = {
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True},
    }
    request = urllib.request.Request(
        server.base_url + "/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def scheduler_pid(server: ServerProcess) -> int:
    for pid in server.child_pids():
        if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    raise AssertionError("no scheduler process found")


def test_an_idle_server_runs_no_batches(server):
    """No probe runs through the engine: waiting does not move the batch metrics."""
    time.sleep(3)
    for mode in ("prefill", "decode", "mixed"):
        assert metric(server, "radixserve_batch_size_count", mode=mode) == 0
        assert metric(server, "radixserve_forward_step_seconds_count", mode=mode) == 0
    assert metric(server, "radixserve_requests_total") == 0
    assert metric(server, "radixserve_startup_seconds", phase="total") > 0
    for phase in ("launch", "imports", "model_check", "weight_read"):
        assert metric(server, "radixserve_startup_seconds", phase=phase) > 0, phase


def test_a_start_reads_ahead_what_the_last_one_recorded_and_records_its_own(server, startup_cache):
    log = server.log_path.read_text()
    assert re.search(r"read 0\.00 GB of start-up files ahead in [\d.]+s", log), log[-3000:]
    with mock.patch.dict(os.environ, {"RADIXSERVE_CACHE_DIR": str(startup_cache)}):
        files = json.loads(read_ahead.startup_record_path().read_text())["files"]
    paths = [Path(f["path"]) for f in files]
    assert startup_cache / "sentinel.bin" not in paths  # the scheduler wrote its own record
    # torch's bytecode (pip compiled it) and its library, as the scheduler process loaded them
    assert any(p.parent.parent.name == "torch" and p.suffix == ".pyc" for p in paths)
    assert any(p.name.startswith("libtorch_cpu.so") for p in paths)
    # and a file it read without importing it: transformers' scan of its model sources
    # behind AutoConfig (the spawn target watched the process's opens from its first line)
    assert any(p.suffix == ".py" and {"transformers", "models"} <= set(p.parts) for p in paths)


def test_ready_through_a_saturating_burst_then_usage_falls_to_zero(server):
    prompts = [[10 + i] * 24 + list(range(100, 140)) for i in range(16)]
    ready_codes: list[int] = []
    done = threading.Event()

    def poll_ready() -> None:
        while not done.is_set():
            ready_codes.append(server.get("/ready", timeout=5)[0])
            time.sleep(0.05)

    poller = threading.Thread(target=poll_ready)
    poller.start()
    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda ids: generate(server, ids, 24), prompts))
    done.set()
    poller.join()
    statuses = [status for status, _ in replies]
    assert 429 in statuses, "the burst did not fill the queue"  # running 2 + queued 6 < 16
    assert 200 in statuses
    assert ready_codes and set(ready_codes) == {200}, "a saturated, healthy pod went unready"

    assert metric(server, "radixserve_kv_cache_usage_ratio") == 0
    assert metric(server, "radixserve_kv_cache_evictable_ratio") > 0
    served = next(ids for ids, (status, _) in zip(prompts, replies, strict=True) if status == 200)
    status, again = generate(server, served, 4)
    assert status == 200 and again["meta_info"]["cached_tokens"] >= len(served) - 1
    assert metric(server, "radixserve_kv_cache_usage_ratio") == 0


def test_a_stopped_scheduler_loop_turns_ready_503_and_back(server):
    assert server.get("/ready")[0] == 200
    pid = scheduler_pid(server)
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + STALL_TIMEOUT_S + 10
        while server.get("/ready")[0] == 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        status, body = server.get("/ready")
        assert status == 503
        assert "has not reported" in json.loads(body)["reason"]
        assert server.get("/health")[0] == 200  # the process lives: liveness is not readiness
    finally:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 20
    while server.get("/ready")[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server.get("/ready")[0] == 200
