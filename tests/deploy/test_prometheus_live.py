"""Every dashboard query and recording rule, answered by a real Prometheus scraping a real worker.

The worker serves the bundled SmolLM2-135M on the CPU behind a `radixserve router`; Debian's
`prometheus` scrapes both every second with the project's rule files loaded; OpenAI-client
traffic through the router (shared prefixes, streaming, concurrency) makes every histogram and
counter move. Then each PromQL expression of each
dashboard panel (Grafana variables substituted as Grafana would, repeated panels once per
value) and of each recording rule must return data with at least one finite sample.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import yaml

from radixserve.bench.server_process import ServerProcess, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "radixserve-live"
JOB = "radixserve"
LORA_ADAPTERS = ("sql", "poet")
SCRAPE_DEADLINE_S = 120
SYSTEM_PROMPT = "You are a terse assistant. Answer in one short sentence. " * 4
QUESTIONS = [
    "What is a radix tree?",
    "Why batch requests?",
    "What is a KV cache?",
    "Name a prime number.",
    "What colour is the sky?",
    "Why stream tokens?",
    "What is Kubernetes?",
    "What does Prometheus scrape?",
]

pytestmark = pytest.mark.slow


import radixserve_promql_contract as contract  # noqa: E402  (loaded by conftest)


@dataclass(frozen=True)
class Worker:
    url: str
    model: str


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def wait_until(what: str, ready, process: subprocess.Popen, deadline_s: float) -> None:
    """Poll `ready()` until it is true; fail if the process dies or the deadline passes."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"{what}: the process exited with {process.returncode}"
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{what} not reached within {deadline_s} s")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def started_worker(args: list[str], log_path: Path) -> Iterator[ServerProcess]:
    """`radixserve serve` on the CPU with a 4k-token pool and `args`, ready; its log's tail
    printed when it does not get there."""
    try:
        with ServerProcess(["--max-total-tokens", "4096", "--device", "cpu", *args], log_path) as p:
            yield p
    except (RuntimeError, TimeoutError):
        print(log_path.read_text()[-5000:])
        raise


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    log_path = tmp_path_factory.mktemp("worker") / "worker.log"
    # speculative decoding on, so that its panels have data: see send_spec_traffic
    args = ["--speculative-method", "ngram"]
    # the KV tiers on, so that their panels have data: see send_tier_traffic
    disk = tmp_path_factory.mktemp("kv-disk")
    args += ["--kv-host-memory", "1", "--kv-disk-path", str(disk), "--kv-disk-size", "1"]
    with started_worker(args, log_path) as process:
        (model,) = [m["id"] for m in get_json(f"{process.base_url}/v1/models")["data"]]
        yield Worker(process.base_url, model)


@pytest.fixture(scope="module")
def lora_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    """A second worker of the same model serving two LoRA adapters over one device slot (the
    first one's speculative decoding and disk tier are not served with adapters), so that the
    LoRA panels have data: see send_lora_traffic."""
    from tests.integration.lora_adapters import write_smollm2_adapter

    home = tmp_path_factory.mktemp("lora-worker")
    args = ["--max-loras", "1"]
    for seed, name in enumerate(LORA_ADAPTERS):
        path = write_smollm2_adapter(home / name, 8, seed)
        args += ["--lora-modules", f"{name}={path}"]
    with started_worker(args, home / "worker.log") as process:
        cards = get_json(f"{process.base_url}/v1/models")["data"]
        (model,) = [m["id"] for m in cards if not m.get("parent")]
        yield Worker(process.base_url, model)


@pytest.fixture(scope="module")
def router(worker: Worker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    """The router in front of the worker: the clients' endpoint, with the same model name."""
    log_path = tmp_path_factory.mktemp("router") / "router.log"
    args = ["--worker-url", worker.url, "--model-name", worker.model]
    with ServerProcess(args, log_path, subcommand="router") as process:
        yield Worker(process.base_url, worker.model)


@pytest.fixture(scope="module")
def prometheus(
    worker: Worker,
    router: Worker,
    lora_worker: Worker,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not on PATH: `make test` puts Debian's package into .venv"
    home = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in contract.RULE_FILES],
        "scrape_configs": [
            {
                "job_name": JOB,
                "scrape_interval": "1s",
                "static_configs": [
                    {
                        "targets": [
                            worker.url.removeprefix("http://"),
                            router.url.removeprefix("http://"),
                            lora_worker.url.removeprefix("http://"),
                        ],
                        # What the Kubernetes service discovery would attach.
                        "labels": {"namespace": NAMESPACE},
                    }
                ],
            }
        ],
    }
    (home / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    command = [
        binary,
        f"--config.file={home / 'prometheus.yml'}",
        f"--storage.tsdb.path={home / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with (home / "prometheus.log").open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=home)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            "Prometheus scraping the worker",
            lambda: any(
                sample["value"][1] == "1" for sample in instant(url, f'up{{job="{JOB}"}}')["result"]
            ),
            process,
            SCRAPE_DEADLINE_S,
        )
        yield url
    except AssertionError:
        print((home / "prometheus.log").read_text()[-5000:])
        raise
    finally:
        stop(process)


def instant(prometheus_url: str, expr: str, at: float | None = None) -> dict:
    """An instant query, at `at` (Unix seconds) or now."""
    params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
    query = urllib.parse.urlencode(params)
    answer = get_json(f"{prometheus_url}/api/v1/query?{query}")
    assert answer["status"] == "success", answer
    return answer["data"]


def label_values(prometheus_url: str, label: str, series_selector: str) -> list[str]:
    """Grafana's label_values(selector, label), through the same API Grafana calls."""
    query = urllib.parse.urlencode({"match[]": series_selector})
    answer = get_json(f"{prometheus_url}/api/v1/label/{label}/values?{query}")
    assert answer["status"] == "success", answer
    return answer["data"]


def send_traffic(worker: Worker) -> int:
    """Concurrent chat completions sharing a long system prompt, half of them streamed."""
    client = openai.OpenAI(base_url=f"{worker.url}/v1", api_key="unused", timeout=300)

    def ask(index: int) -> None:
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]},
        ]
        if index % 2:
            stream = client.chat.completions.create(
                model=worker.model, messages=messages, max_tokens=12, stream=True
            )
            assert any(chunk.choices and chunk.choices[0].delta.content for chunk in stream)
        else:
            reply = client.chat.completions.create(
                model=worker.model, messages=messages, max_tokens=12
            )
            assert reply.usage.completion_tokens > 0

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(ask, range(len(QUESTIONS))))
    return len(QUESTIONS)


def send_tier_traffic(worker: Worker) -> int:
    """Three long prompts that overflow the 4096-token pool, then the first again: its
    prefix comes back from the host tier (a restore, bytes moved both ways, a host hit)."""
    client = openai.OpenAI(base_url=f"{worker.url}/v1", api_key="unused", timeout=300)
    prompts = [f"{name} " + " ".join(str(n) for n in range(700)) for name in ("A", "B", "C")]
    for prompt in [*prompts, prompts[0]]:
        reply = client.completions.create(model=worker.model, prompt=prompt, max_tokens=2)
        assert reply.usage.completion_tokens > 0
    return len(prompts) + 1


def send_lora_traffic(worker: Worker) -> int:
    """The two adapters in turn over one device slot: requests and tokens per adapter, a
    resident adapter, loads and evictions."""
    client = openai.OpenAI(base_url=f"{worker.url}/v1", api_key="unused", timeout=300)
    names = [*LORA_ADAPTERS, *LORA_ADAPTERS]
    for name in names:
        reply = client.completions.create(model=name, prompt="Hello there", max_tokens=2)
        assert reply.usage.completion_tokens > 0
    return len(names)


def send_spec_traffic(worker: Worker) -> int:
    """A request whose answer copies its prompt: prompt lookup proposes, the target accepts.
    Greedy: a sampled answer (the API's default temperature 1) strays from the prompt and may
    leave nothing for prompt lookup to propose."""
    client = openai.OpenAI(base_url=f"{worker.url}/v1", api_key="unused", timeout=300)
    text = "one two three four five six seven eight nine ten " * 4
    reply = client.completions.create(model=worker.model, prompt=text, max_tokens=32, temperature=0)
    assert reply.usage.completion_tokens > 0
    return 1


@pytest.fixture(scope="module")
def scraped_traffic(
    worker: Worker, router: Worker, lora_worker: Worker, prometheus: str
) -> dict[str, str]:
    """Sends traffic, waits until Prometheus has scraped all of it; returns Grafana's values."""
    assert lora_worker.model == worker.model  # one model: the dashboards' $model_name
    # speculative decoding's last: its ratio panel (accepted / proposed over the last minute)
    # is NaN unless its traffic is inside that minute, however long the rest took on a loaded
    # machine; the LoRA panels are plain rates
    direct = send_lora_traffic(lora_worker)
    routed = send_traffic(router) + send_tier_traffic(router) + send_spec_traffic(router)
    for counter, sent in (
        ("radixserve_requests_total", routed + direct),
        ("radixserve_router_requests_total", routed),
    ):
        selector = f'{counter}{{job="{JOB}"}}'
        deadline = time.monotonic() + SCRAPE_DEADLINE_S
        while time.monotonic() < deadline:
            result = instant(prometheus, f"sum({selector})")["result"]
            if result and float(result[0]["value"][1]) >= sent:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"Prometheus never saw the finished requests ({counter})")
    # A few more scrapes and rule evaluations after the last request.
    time.sleep(3)
    return {
        "datasource": "prometheus",
        "namespace": NAMESPACE,
        "model_name": worker.model,
        "__rate_interval": "1m",
        # the end of the dashboard's time range, where Grafana evaluates its panels: now, so
        # that however long the module's other tests take, a one-minute rate still holds the
        # traffic (speculative decoding's acceptance ratio is NaN over an idle minute)
        "__to": str(int(time.time() * 1000)),
    }


def _assert_returns_data(prometheus: str, where: str, expr: str, at: float | None = None) -> None:
    result = instant(prometheus, expr, at)["result"]
    assert result, f"{where}: no data for {expr}"
    values = [float(sample["value"][1]) for sample in result]
    assert any(math.isfinite(v) for v in values), f"{where}: only NaN/Inf {values} for {expr}"


def test_dashboard_variables_list_the_live_namespace_model_and_modes(
    prometheus: str, worker: Worker, scraped_traffic: dict[str, str]
) -> None:
    for query in contract.variable_queries():
        # label_values(<selector>, <label>) as Grafana's Prometheus data source runs it.
        inner = query.expr.removeprefix("label_values(").removesuffix(")")
        selector, label = (part.strip() for part in inner.rsplit(",", 1))
        values = label_values(prometheus, label, contract.substitute(selector, scraped_traffic))
        expected = {
            "namespace": NAMESPACE,
            "model_name": worker.model,
            "mode": "decode",
        }[label]
        assert expected in values, f"{query.where}: {values}"


def test_every_dashboard_panel_query_returns_data(
    prometheus: str, scraped_traffic: dict[str, str]
) -> None:
    modes = label_values(prometheus, "mode", "radixserve_batch_size_count")
    assert {"prefill", "decode"} <= set(modes)
    queries = contract.dashboard_queries()
    assert len(queries) >= 40
    for query in queries:
        # Repeated panels run once per value of their variable, as Grafana repeats them.
        for mode in modes if "$mode" in query.expr else [".*"]:
            expr = contract.substitute(query.expr, {**scraped_traffic, "mode": mode})
            at = int(scraped_traffic["__to"]) / 1000
            _assert_returns_data(prometheus, f"{query.where} (mode={mode})", expr, at)


def test_every_recording_rule_expression_returns_data(
    prometheus: str, scraped_traffic: dict[str, str]
) -> None:
    queries = contract.rule_queries("record")
    assert queries
    for query in queries:
        _assert_returns_data(prometheus, query.where, query.expr)


def test_prometheus_loaded_and_evaluates_every_rule_healthily(
    prometheus: str, scraped_traffic: dict[str, str]
) -> None:
    groups = get_json(f"{prometheus}/api/v1/rules")["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    expected = len(contract.rule_queries("record")) + len(contract.rule_queries("alert"))
    assert len(rules) == expected
    assert all(rule["health"] == "ok" for rule in rules), [
        (rule["name"], rule.get("lastError")) for rule in rules if rule["health"] != "ok"
    ]
    recorded = instant(prometheus, "namespace_model_name:radixserve_requests:rate5m")["result"]
    assert recorded and recorded[0]["metric"]["namespace"] == NAMESPACE
