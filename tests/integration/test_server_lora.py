"""LoRA adapters over HTTP, driven with the official openai client: the bundled SmolLM2 with
two adapters from `--lora-modules`; `model` selects an adapter in chat, completions and the
native /generate; /v1/models lists them with parent and root; unknown names get a 404
`model_not_found` listing what is served; /v1/load_lora_adapter and /v1/unload_lora_adapter
(vLLM's) behind the admin key, with clear 400s for bad adapters and nothing else disturbed."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import requests
from lora_adapters import SMOLLM2_HIDDEN as HIDDEN
from lora_adapters import write_smollm2_adapter as write_adapter

from radixserve.bench.server_process import ServerProcess

API_KEY, ADMIN_KEY = "sk-lora", "sk-lora-admin"
PROMPT = "The capital of France is"
SQL_ANSWER: dict[str, str] = {}  # the sql adapter's reply, computed once


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_server")
    adapters = {
        "sql": write_adapter(root / "sql", 8, 1),
        "poet": write_adapter(root / "poet", 16, 2),
        "spare": write_adapter(root / "spare", 4, 3),
        "too-big": write_adapter(root / "too-big", 32, 4),
        "other-model": write_adapter(root / "other-model", 4, 5, in_features=HIDDEN * 2),
    }
    args = ["--max-total-tokens", "4096", "--api-key", API_KEY, "--admin-api-key", ADMIN_KEY]
    args += ["--lora-modules", f"sql={adapters['sql']}", "--lora-modules"]
    args += [f"poet={adapters['poet']}", "--max-loras", "2", "--max-lora-rank", "16"]
    log = root / "server.log"
    with ServerProcess(args, log_path=log) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)
        yield server, client, adapters
        client.close()
    assert server.process.returncode == 0, log.read_text()[-3000:]


def chat(client: openai.OpenAI, model: str) -> str:
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=5,
        temperature=0,
    )
    assert reply.model == model or not getattr(client.models.retrieve(model), "parent", None)
    return reply.choices[0].message.content


def admin(server: ServerProcess, path: str, body: dict, key: str = ADMIN_KEY) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return requests.post(server.base_url + path, json=body, headers=headers, timeout=60)


def test_models_lists_adapters_with_parent_and_root(served):
    server, client, adapters = served
    cards = {m.id: m for m in client.models.list().data}
    base = next(m for m in cards.values() if not getattr(m, "parent", None))
    for name in ("sql", "poet"):
        assert cards[name].parent == base.id and cards[name].root == str(adapters[name])
    assert client.models.retrieve("sql").root == str(adapters["sql"])


def test_model_selects_the_adapter_in_every_endpoint(served):
    server, client, _ = served
    base_model = next(m.id for m in client.models.list().data if m.id not in ("sql", "poet"))
    outputs = {m: chat(client, m) for m in (base_model, "sql", "poet")}
    SQL_ANSWER["sql"] = outputs["sql"]
    assert len(set(outputs.values())) == 3, outputs  # each adapter changes the output
    assert chat(client, "sql") == outputs["sql"]  # deterministic, and its own prefix cache
    completion = client.completions.create(model="poet", prompt=PROMPT, max_tokens=4, temperature=0)
    base_completion = client.completions.create(
        model=base_model, prompt=PROMPT, max_tokens=4, temperature=0
    )
    assert completion.choices[0].text != base_completion.choices[0].text
    assert completion.model == "poet" and base_completion.model == base_model  # as vLLM names
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    native = requests.post(
        server.base_url + "/generate", json={**body, "model": "poet"}, headers=headers, timeout=60
    ).json()
    assert native["text"] == completion.choices[0].text


def test_metrics_show_adapters(served):
    """After the requests above: the Gateway API Inference Extension's gauge and the
    per-adapter counters on /metrics."""
    server, client, _ = served
    chat(client, "sql")
    text = requests.get(server.base_url + "/metrics", timeout=30).text
    assert "radixserve_lora_requests_info{" in text and 'max_lora="2"' in text
    assert 'radixserve_lora_requests_total{lora_name="sql"' in text
    assert "radixserve_lora_generation_tokens_total" in text


def test_unknown_model_is_a_404_listing_what_is_served(served):
    _, client, _ = served
    with pytest.raises(openai.NotFoundError) as caught:
        chat(client, "nope")
    error = caught.value.body
    assert error["code"] == "model_not_found" and "sql" in error["message"]
    assert "poet" in error["message"]


def test_load_and_unload_through_the_admin_endpoints(served):
    server, client, adapters = served
    body = {"lora_name": "spare", "lora_path": str(adapters["spare"])}
    assert admin(server, "/v1/load_lora_adapter", body, key=API_KEY).status_code == 401
    loaded = admin(server, "/v1/load_lora_adapter", body)
    assert loaded.status_code == 200, loaded.text
    assert "spare" in {m.id for m in client.models.list().data}
    first = chat(client, "spare")
    assert admin(server, "/v1/unload_lora_adapter", {"lora_name": "spare"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        chat(client, "spare")
    again = admin(server, "/v1/unload_lora_adapter", {"lora_name": "spare"})
    assert again.status_code == 404 and again.json()["error"]["code"] == "model_not_found"
    assert admin(server, "/v1/load_lora_adapter", body).status_code == 200
    assert chat(client, "spare") == first


@pytest.mark.parametrize(
    "case, message",
    [
        ("too-big", "exceeds --max-lora-rank"),
        ("other-model", "trained for another model"),
        ("missing", "not a directory"),
    ],
)
def test_bad_adapters_get_a_400_and_disturb_nothing(served, case, message):
    server, client, adapters = served
    before = SQL_ANSWER.setdefault("sql", chat(client, "sql"))
    path = str(adapters.get(case, Path("/nonexistent/adapter")))
    reply = admin(server, "/v1/load_lora_adapter", {"lora_name": case, "lora_path": path})
    assert reply.status_code == 400, reply.text
    assert message in reply.json()["error"]["message"]
    assert case not in {m.id for m in client.models.list().data}
    assert chat(client, "sql") == before
