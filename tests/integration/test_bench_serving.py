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
