"""A real `radixserve serve` process driven over HTTP by the official `openai` client and by raw
aiohttp requests (native API, bad inputs, disconnecting clients).

The model is a two-layer random Llama with SmolLM2's vocabulary, so it gets the bundled
tokenizer and chat template (real text in and out) at a fraction of the real model's cost; the
bundled model itself is served in test_server_lifecycle.py.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import aiohttp
import jsonschema
import openai
import pytest

from radixserve.bench.server_process import ServerProcess

MODEL = "tiny-smollm-vocab"
MAX_TOTAL_TOKENS = 4096
TINY_LLAMA_WITH_SMOLLM2_VOCAB = {
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("server")
    config = workdir / "config.json"
    config.write_text(json.dumps(TINY_LLAMA_WITH_SMOLLM2_VOCAB))
    args = ["--model", f"random:{config}", "--served-model-name", MODEL]
    args += ["--max-total-tokens", str(MAX_TOTAL_TOKENS)]
    log = workdir / "server.log"
    with ServerProcess(args, log_path=log) as proc:
        yield proc
    assert proc.process.returncode == 0, log.read_text()[-3000:]


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    """One sample of /metrics: the series `name` whose labels include `labels`."""
    status, body = server.get("/metrics")
    assert status == 200
    for match in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", body.decode(), re.MULTILINE):
        series_labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if labels.items() <= series_labels.items():
            return float(match.group(2))
    raise AssertionError(f"{name} {labels} not exported")


def wait_until(condition, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def post(server: ServerProcess, path: str, body: object) -> tuple[int, dict, dict]:
    async def go():
        async with aiohttp.ClientSession() as session:
            data = body if isinstance(body, bytes | str) else json.dumps(body)
            async with session.post(server.base_url + path, data=data) as reply:
                return reply.status, await reply.json(content_type=None), dict(reply.headers)

    return asyncio.run(go())


# ------------------------------------------------------------------ OpenAI client


def test_completion_reports_usage_and_length(client):
    reply = client.completions.create(
        model=MODEL,
        prompt="The capital of France is",
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    assert choice.text
    assert reply.usage.completion_tokens == 8
    assert reply.usage.prompt_tokens > 0
    assert reply.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_completion(client):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a color."}],
        max_tokens=16,
        temperature=0,
    )
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_chat_stream_matches_the_non_streamed_text(client):
    request = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count from one to five."}],
        "max_tokens": 24,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**request).choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_completion_stream(client):
    stream = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_n_samples_share_the_prompt(client):
    reply = client.completions.create(
        model=MODEL,
        prompt="A list of fruits:",
        max_tokens=6,
        n=3,
        temperature=1.0,
        seed=1,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in reply.choices) == [0, 1, 2]
    assert all(c.text for c in reply.choices)
    assert reply.usage.completion_tokens == 18
    prompt_only = client.completions.create(model=MODEL, prompt="A list of fruits:", max_tokens=1)
    assert reply.usage.prompt_tokens == prompt_only.usage.prompt_tokens


def test_stream_with_n_has_every_index(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=5,
            n=2,
            stream=True,
        )
    )
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}


def test_stop_string_cuts_the_text_before_it(client):
    prompt = "1, 2, 3, 4, 5, 6,"
    free = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    text = free.choices[0].text
    stop = text.strip()[2:4] if len(text.strip()) > 4 else text.strip()[-1]
    cut = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=[stop]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]
    assert stop not in cut.choices[0].text


def test_completion_logprobs(client):
    reply = client.completions.create(
        model=MODEL,
        prompt="Hello",
        max_tokens=5,
        temperature=0,
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 5
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    assert all(1 <= len(top) <= 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset == sorted(logprobs.text_offset)
    # Greedy: the chosen token is the most likely one.
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert chosen == pytest.approx(max(top.values()), abs=1e-4)


def test_chat_logprobs(client):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=3,
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert all(len(entry.top_logprobs) == 3 for entry in content)


def test_echo_prepends_the_prompt(client):
    reply = client.completions.create(model=MODEL, prompt="Roses are", max_tokens=3, echo=True)
    assert reply.choices[0].text.startswith("Roses are")


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-17", prompt="x", max_tokens=1)


def test_out_of_range_parameter_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="x", max_tokens=1, top_p=1.5)
    assert info.value.body["param"] == "top_p"


# ------------------------------------------------------------------ prefix cache


def test_shared_system_prompt_is_served_from_the_cache(client, server):
    assert post(server, "/flush_cache", b"")[0] == 200
    system = "You are a careful assistant. " * 30
    hits = "radixserve_prefix_cache_hits_tokens_total"  # no KV tiers: every hit is on the GPU
    hits_before = metric(server, hits, tier="gpu")
    usages = []
    for question in ("What is 2 + 2?", "Name a planet."):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=2,
        )
        usages.append(reply.usage)
    assert usages[0].prompt_tokens_details.cached_tokens < 20
    assert usages[1].prompt_tokens_details.cached_tokens >= 150
    assert metric(server, hits, tier="gpu") - hits_before >= 150


# ------------------------------------------------------------------ native API and bad inputs


def test_native_generate_text_and_ids(server):
    status, reply, _ = post(
        server,
        "/generate",
        {"text": "Hello, my name is", "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
    )
    assert status == 200
    assert len(reply["output_ids"]) == 4
    assert reply["meta_info"]["finish_reason"] == {"type": "length"}
    ids_status, by_ids, _ = post(
        server,
        "/generate",
        {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}, "return_logprob": True},
    )
    assert ids_status == 200
    assert len(by_ids["meta_info"]["output_token_logprobs"]) == 2


def test_native_generate_follows_a_json_schema_whatever_the_model(server):
    """The model has random weights; the grammar alone makes its output valid."""
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "legs": {"type": "integer", "minimum": 0, "maximum": 8},
            "tags": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2},
        },
        "required": ["name", "legs"],
    }
    params = {"max_new_tokens": 120, "temperature": 0.8, "seed": 3}
    status, reply, _ = post(
        server,
        "/generate",
        {"text": "A pet:", "sampling_params": {**params, "json_schema": json.dumps(schema)}},
    )
    assert status == 200
    assert reply["meta_info"]["finish_reason"]["type"] == "stop"
    jsonschema.validate(json.loads(reply["text"]), schema)
    status, reply, _ = post(
        server,
        "/generate",
        {"text": "A date:", "sampling_params": {**params, "regex": r"20\d\d-[01]\d"}},
    )
    assert status == 200 and re.fullmatch(r"20\d\d-[01]\d", reply["text"])


def test_a_stream_whose_grammar_does_not_compile_is_a_400_before_any_event(server):
    async def go():
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                server.base_url + "/generate",
                json={"text": "Hi", "sampling_params": {"ebnf": "root ::= x"}, "stream": True},
            ) as reply,
        ):
            return reply.status, await reply.json(content_type=None)

    status, reply = asyncio.run(go())
    assert status == 400 and reply["error"]["param"] == "sampling_params.ebnf"
    assert 'Rule "x" is not defined' in reply["error"]["message"]


def test_native_generate_stream(server):
    async def go():
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                server.base_url + "/generate",
                json={"text": "Hi", "sampling_params": {"max_new_tokens": 5}, "stream": True},
            ) as reply,
        ):
            return [line async for line in reply.content if line.strip()]

    lines = asyncio.run(go())
    assert lines[-1] == b"data: [DONE]\n"
    items = [json.loads(line.removeprefix(b"data: ")) for line in lines[:-1]]
    assert sum(len(i["output_ids"]) for i in items) == 5
    assert items[-1]["meta_info"]["finish_reason"] == {"type": "length"}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions", b"{not json", 400, None),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "7"}, 400, "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": -1}, 400, "temperature"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "top_k": -3}, 400, "top_k"),
        ("/v1/completions", {"model": "other", "prompt": "x"}, 404, "model"),
        ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, 400, "messages"),
        (
            "/generate",
            {"text": "x", "sampling_params": {"max_new_tokens": -1}},
            400,
            "sampling_params.max_new_tokens",
        ),
        ("/generate", {"text": "x", "input_ids": [1]}, 400, None),
        ("/generate", {"input_ids": [1, 10**7]}, 400, "input_ids"),
        ("/generate", {"input_ids": "1 2"}, 400, None),
        ("/v1/completions", {"model": MODEL, "prompt": [1, 10**7]}, 400, "prompt"),
        ("/generate", {"text": "x", "sampling_params": {"temperature": "hot"}}, 400, None),
        ("/generate", {"text": "x", "stream": "yes"}, 400, "stream"),
        # constraints: the front end's check, then what only the scheduler's compile finds
        (
            "/generate",
            {"text": "x", "sampling_params": {"json_schema": "{no"}},
            400,
            "sampling_params.json_schema",
        ),
        (
            "/generate",
            {"text": "x", "sampling_params": {"regex": "(ab"}},
            400,
            "sampling_params.regex",
        ),
        (
            "/generate",
            {"text": "x", "sampling_params": {"regex": "(?=a)b"}},
            400,
            "sampling_params.regex",
        ),
        (
            "/generate",
            {"text": "x", "sampling_params": {"ebnf": "root ::= item"}},
            400,
            "sampling_params.ebnf",
        ),
        (
            "/generate",
            {
                "text": "x",
                "sampling_params": {
                    "json_schema": '{"type": "string", "minLength": 3, "maxLength": 1}'
                },
            },
            400,
            "sampling_params.json_schema",
        ),
        (
            "/generate",
            {"text": "x", "sampling_params": {"regex": "a", "ebnf": 'root ::= "a"'}},
            400,
            "sampling_params.ebnf",
        ),
        (
            "/generate",
            {"text": "x", "sampling_params": {"logit_bias": {"x": 1}}},
            400,
            "sampling_params.logit_bias",
        ),
        (
            "/generate",
            {"text": "x", "sampling_params": {"logit_bias": {"5": 101}}},
            400,
            "sampling_params.logit_bias",
        ),
        ("/no/such/route", {}, 404, None),
    ],
)
def test_bad_requests_get_openai_errors(server, path, body, status, param):
    got, reply, _ = post(server, path, body)
    assert got == status
    assert set(reply["error"]) == {"message", "type", "param", "code"}
    if param is not None:
        assert reply["error"]["param"] == param


def test_prompt_longer_than_the_context_is_a_400_that_says_so(server):
    got, reply, _ = post(
        server,
        "/v1/completions",
        {"model": MODEL, "prompt": list(range(100, 100 + MAX_TOTAL_TOKENS + 10)), "max_tokens": 1},
    )
    assert got == 400
    assert "maximum context length" in reply["error"]["message"]
    assert reply["error"]["code"] == "context_length_exceeded"


def test_server_keeps_serving_after_bad_requests(server, client):
    assert server.get("/health")[0] == 200
    assert client.completions.create(model=MODEL, prompt="ok", max_tokens=1).choices


def test_introspection_endpoints(server):
    status, body = server.get("/get_model_info")
    assert status == 200 and json.loads(body)["context_len"] > 0
    status, body = server.get("/get_server_info")
    info = json.loads(body)
    assert status == 200
    assert info["max_total_tokens"] == MAX_TOTAL_TOKENS
    assert "prefix_cache_hit_tokens" in info
    assert server.get("/ready")[0] == 200


# ------------------------------------------------------------------ many clients


def test_concurrent_streams_with_disconnects_free_everything(server):
    num_clients, num_disconnecting = 32, 8

    async def stream(session: aiohttp.ClientSession, i: int) -> str:
        body = {
            "model": MODEL,
            "prompt": f"Story number {i}:",
            "max_tokens": 12,
            "stream": True,
            "ignore_eos": True,
        }
        async with session.post(server.base_url + "/v1/completions", json=body) as reply:
            assert reply.status == 200
            async for line in reply.content:
                if i < num_disconnecting and line.startswith(b"data: {"):
                    return "disconnected"  # leaving the block closes the connection
                if line.strip() == b"data: [DONE]":
                    return "done"
        return "truncated"

    async def run_all():
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            return await asyncio.gather(*(stream(session, i) for i in range(num_clients)))

    aborts_before = metric(server, "radixserve_requests_total", finish_reason="abort")
    results = asyncio.run(run_all())
    assert results[:num_disconnecting] == ["disconnected"] * num_disconnecting
    assert results[num_disconnecting:] == ["done"] * (num_clients - num_disconnecting)

    def idle() -> bool:
        return (
            metric(server, "radixserve_num_running_requests") == 0
            and metric(server, "radixserve_num_queued_requests") == 0
        )

    assert wait_until(idle)

    def kv_holds_only_the_cache() -> bool:
        """Nothing is held by a request (usage 0); what stays is evictable prefix cache."""
        info = json.loads(server.get("/get_server_info")[1])
        cached = info["evictable_size"] / info["max_total_tokens"]
        usage = metric(server, "radixserve_kv_cache_usage_ratio")
        evictable = metric(server, "radixserve_kv_cache_evictable_ratio")
        return (
            info["protected_size"] == 0
            and usage == 0
            and evictable == pytest.approx(cached, abs=1e-9)
            and evictable > 0
        )

    assert wait_until(kv_holds_only_the_cache)
    aborts = metric(server, "radixserve_requests_total", finish_reason="abort") - aborts_before
    assert aborts == num_disconnecting


def test_a_client_that_gives_up_on_a_non_streamed_request_aborts_it(server):
    aborts_before = metric(server, "radixserve_requests_total", finish_reason="abort")
    body = {"model": MODEL, "prompt": [11, 12, 13], "max_tokens": 2000, "ignore_eos": True}

    async def give_up():
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            with pytest.raises(asyncio.TimeoutError):
                await session.post(server.base_url + "/v1/completions", json=body)

    asyncio.run(give_up())
    assert wait_until(
        lambda: metric(server, "radixserve_requests_total", finish_reason="abort") > aborts_before
    )
    assert wait_until(lambda: metric(server, "radixserve_num_running_requests") == 0)


def architecture_metric_names() -> set[str]:
    """Every `radixserve_*` name in the metrics table of docs/architecture.md."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    table = page[page.index("Metrics (prefix") :]
    table = table[: table.index("\n\n", table.index("| name"))]
    return set(re.findall(r"`(radixserve_\w+)`", table))


def test_every_documented_metric_is_exported_and_moves(server, client):
    client.completions.create(model=MODEL, prompt="warm up the histograms", max_tokens=3)
    exported = server.get("/metrics")[1].decode()
    names = architecture_metric_names()
    assert len(names) >= 18
    # every documented family is exported, but those of features this server runs without:
    # the LoRA families exist only on a server with adapters (tests/unit/test_lora_metrics.py
    # exposes each), the KV tiers' series appear with the tiers' first report
    # (tests/deploy/test_prometheus_live.py scrapes a worker that runs them)
    feature_gated = ("radixserve_lora_", "radixserve_kv_tier_", "radixserve_kv_restore_")
    for name in sorted(n for n in names if not n.startswith(feature_gated)):
        assert re.search(rf"^{name}(_bucket|_count|_sum)?\{{", exported, re.MULTILINE), name
    for histogram in (
        "radixserve_time_to_first_token_seconds",
        "radixserve_inter_token_latency_seconds",
        "radixserve_e2e_request_latency_seconds",
        "radixserve_queue_time_seconds",
    ):
        assert metric(server, histogram + "_count") > 0, histogram
    for mode in ("prefill", "decode"):
        assert metric(server, "radixserve_batch_size_count", mode=mode) > 0
        assert metric(server, "radixserve_batch_tokens_sum", mode=mode) > 0
        assert metric(server, "radixserve_forward_step_seconds_count", mode=mode) > 0
    assert metric(server, "radixserve_max_total_tokens") == MAX_TOTAL_TOKENS
    assert metric(server, "radixserve_generation_tokens_total") > 0
    assert metric(server, "radixserve_requests_total", finish_reason="length") > 0
