"""--lora-modules-file (the operator's ConfigMap of spec.loras): a bad adapter in it is logged
and left out, and the server starts with the rest, so one bad entry never keeps a service's new
pods from starting (the operator reports the refusal when it asks running workers to load it);
/v1/models lists what the scheduler actually serves."""

from __future__ import annotations

import json

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
