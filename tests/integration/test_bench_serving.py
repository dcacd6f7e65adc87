"""`radixserve bench serving` against a real server it starts: every request completes, the
report's numbers agree with what was asked, a shared prefix is served from the radix cache, and
compute is reported from the server's own parameter count."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_bench_serving_reports_a_real_run(tmp_path):
    report_path = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "radixserve.entrypoints.cli", "bench", "serving",
        "--launch-server", "--model random:tiny-llama --max-total-tokens 4096",
        "--num-requests", "8", "--max-concurrency", "4",
        "--input-len", "48", "--shared-prefix-len", "32", "--output-len", "6",
        "--output-json", str(report_path),
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(report_path.read_text())
    assert report["completed"] == 8 and report["failed"] == 0
    duration = report["duration_s"]
    assert report["output_token_throughput"] * duration == pytest.approx(8 * 6)
    assert report["input_token_throughput"] * duration == pytest.approx(8 * 48)
    # the first wave of 4 arrives before the prefix is cached; the next 4 hit it
    assert 4 * 32 <= report["cached_prompt_tokens"] <= 7 * 47
    assert report["ttft_ms"]["p50"] > 0 and report["e2e_ms"]["p99"] >= report["ttft_ms"]["p99"]
    assert report["achieved_tflops"] > 0
    assert report["mfu"] is None and report["gpu_busy"] is None  # a CPU server
    assert "compute (TFLOP/s)" in proc.stdout


def test_bench_serving_compares_apis_on_one_server(tmp_path):
    """`--api chat,responses,messages`: the same prompts through each endpoint of one server;
    every API produces the requested tokens, and the table and JSON carry the ratio to chat.
    A tiny random model with the bundled tokenizer's vocabulary (text requests need one; random
    weights all but never sample the end of turn, which Responses and Messages cannot ignore)."""
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "llama", "vocab_size": 49152, "hidden_size": 64,
                "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
                "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
            }
        )
    )  # fmt: skip
    report_path = tmp_path / "apis.json"
    command = [
        sys.executable, "-m", "radixserve.entrypoints.cli", "bench", "serving",
        "--launch-server", f"--model random:{config} --max-total-tokens 4096",
        "--api", "chat,responses,messages", "--warmup-requests", "1", "--temperature", "0",
        "--num-requests", "4", "--max-concurrency", "2", "--input-len", "24", "--output-len", "5",
        "--output-json", str(report_path),
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "tok/s vs chat" in proc.stdout and "TPOT vs chat" in proc.stdout
    report = json.loads(report_path.read_text())
    assert report["reference_api"] == "chat"
    assert [row["api"] for row in report["comparison"]] == ["chat", "responses", "messages"]
    prompts = {}
    for row in report["comparison"]:
        assert row["completed"] == 4 and row["output_tokens"] == 4 * 5, row
        assert row["throughput_vs_ref"] > 0 and row["tpot_vs_ref"] > 0
        api = report["apis"][row["api"]]
        assert api["failed"] == 0 and api["ttft_ms"]["p50"] > 0 and api["itl_ms"]["p50"] > 0
        prompts[row["api"]] = round(api["input_token_throughput"] * api["duration_s"])
    chat_row = report["comparison"][0]
    assert chat_row["throughput_vs_ref"] == pytest.approx(1.0)
    # the same words through the same chat template: the same prompt tokens (24 words, one
    # token each, plus the template's) for every API
    assert len(set(prompts.values())) == 1 and prompts["chat"] > 4 * 24, prompts


def test_bench_serving_multi_turn_sessions(tmp_path):
    """`--turns 3`: each session resends its conversation (prompts and the replies' own ids)
    plus new tokens, so later turns hit the cache for everything before them."""
    report_path = tmp_path / "turns.json"
    command = [
        sys.executable, "-m", "radixserve.entrypoints.cli", "bench", "serving",
        "--launch-server", "--model random:tiny-llama --max-total-tokens 4096",
        "--num-requests", "4", "--turns", "3", "--turn-len", "8", "--max-concurrency", "4",
        "--input-len", "32", "--output-len", "4", "--output-json", str(report_path),
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(report_path.read_text())
    assert report["completed"] == 12 and report["failed"] == 0
    # a session's prompts: 32, then 32 + 4 + 8, then 44 + 4 + 8 tokens
    duration = report["duration_s"]
    assert report["input_token_throughput"] * duration == pytest.approx(4 * (32 + 44 + 56))
    # turns 2 and 3 find at least their previous prompt (32 and 44 tokens) cached
    assert report["cached_prompt_tokens"] >= 4 * (32 + 44)
