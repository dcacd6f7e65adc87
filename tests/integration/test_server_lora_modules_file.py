"""--lora-modules-file (the operator's ConfigMap of spec.loras): a bad adapter in it is logged
and left out, and the server starts with the rest, so one bad entry never keeps a service's new
pods from starting (the operator reports the refusal when it asks running workers to load it);
/v1/models lists what the scheduler actually serves."""

from __future__ import annotations

import json

import requests
from lora_adapters import write_smollm2_adapter as write_adapter

from radixserve.bench.server_process import ServerProcess


def test_a_bad_adapter_of_the_file_is_left_out_and_the_server_starts(tmp_path) -> None:
    good = write_adapter(tmp_path / "sql", 8, 1)
    too_big = write_adapter(tmp_path / "too-big", 32, 4)
    modules = tmp_path / "modules"
    modules.write_text(f"sql={good}\ntoo-big={too_big}\nmissing=/nonexistent/adapter\n")
    args = ["--max-total-tokens", "2048", "--lora-modules-file", str(modules)]
    log = tmp_path / "server.log"
    with ServerProcess(args + ["--max-lora-rank", "16"], log_path=log) as server:
        status, body = server.get("/v1/models")
        assert status == 200
        cards = {card["id"]: card for card in json.loads(body)["data"]}
        assert set(cards) == {"smollm2-135m", "sql"}
        assert cards["sql"]["root"] == str(good)
    text = log.read_text()
    assert "too-big of --lora-modules-file not served" in text and "exceeds --max-lora-rank" in text
    assert "missing of --lora-modules-file not served" in text


def test_lazy_adapters_are_listed_unread_and_read_on_first_request(tmp_path) -> None:
    """--lora-load lazy (placement onDemand): every adapter of the file is listed by
    /v1/models with nothing read; the first request of one reads it into a slot and is served
    (the next gets the same text from the resident copy); one whose source is missing answers
    that request with a 400 naming it, and the server goes on. (Token parity with PEFT on first
    use: test_lora_correctness.)"""
    good = write_adapter(tmp_path / "sql", 8, 1)
    modules = tmp_path / "modules"
    modules.write_text(f"sql={good}\nmissing=/nonexistent/adapter\n")
    args = ["--max-total-tokens", "2048", "--lora-modules-file", str(modules)]
    with ServerProcess(args + ["--lora-load", "lazy", "--max-loras", "1"]) as server:
        status, body = server.get("/v1/models")
        cards = {card["id"]: card for card in json.loads(body)["data"]}
        assert status == 200 and set(cards) == {"smollm2-135m", "sql", "missing"}
        info = json.loads(server.get("/get_server_info")[1])
        assert info["lora_loads"] == 0 and info["lora_resident"] == []

        def complete(model: str) -> requests.Response:
            body = {"model": model, "prompt": "SELECT", "max_tokens": 6, "temperature": 0}
            return requests.post(server.base_url + "/v1/completions", json=body, timeout=120)

        reply = complete("sql")
        assert reply.status_code == 200, reply.text
        info = json.loads(server.get("/get_server_info")[1])
        assert info["lora_loads"] == 1 and info["lora_resident"] == ["sql"]
        refused = complete("missing")
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "lora_load_failed" and error["param"] == "model"
        assert "'missing'" in error["message"] and "/nonexistent/adapter" in error["message"]
        info = json.loads(server.get("/get_server_info")[1])
        assert set(info["lora_failed"]) == {"missing"}
        assert complete("sql").json()["choices"][0]["text"] == reply.json()["choices"][0]["text"]
