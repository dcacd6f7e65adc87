"""The regression guard's table (scripts/headline_table.py): docs/benchmarks.md carries exactly
what benchmarks/headline.json renders, every figure has a recorded value, and `collect` reads
the figures out of the drivers' JSON (in the shapes `bench latency`, `bench offline`,
bench_grammar.py and cold_start.py write) and flags a regression."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def headline():
    spec = importlib.util.spec_from_file_location(
        "headline_table", REPO / "scripts" / "headline_table.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_the_benchmarks_page_carries_the_table_the_recorded_values_render(headline):
    recorded = json.loads((REPO / "benchmarks" / "headline.json").read_text())
    page = (REPO / "docs" / "benchmarks.md").read_text()
    assert headline.docs_table(page) == headline.render(recorded)


def test_every_figure_is_recorded_and_nothing_else(headline):
    recorded = json.loads((REPO / "benchmarks" / "headline.json").read_text())
    assert set(recorded["figures"]) == set(headline.BY_ID)
    assert all(entry["values"] for entry in recorded["figures"].values())


def recorded_copy(tmp_path: Path) -> Path:
    """The recorded values with the two these tests compare against fixed (the real file
    changes with every recorded run)."""
    data = json.loads((REPO / "benchmarks" / "headline.json").read_text())
    data["figures"]["offline-tok-s"]["values"] = [29510.0, 29951.0]
    data["figures"]["8b-bs1-ms"]["values"] = [3.945]
    path = tmp_path / "recorded.json"
    path.write_text(json.dumps(data))
    return path


def latency(rows: list[tuple[int, float, float]]) -> dict:
    return {"rows": [{"bs": bs, "decode_step_s": s, "decode_mbu": m} for bs, s, m in rows]}


def write_runs(out: Path) -> None:
    files = {
        "latency-8b": latency([(1, 0.004, 0.90), (64, 0.0063, 0.73)]),
        "latency-8b-fp8": latency([(1, 0.0025, 0.78)]),
        "offline-8b": {
            "results": [{"total_tok_s": 25000.0, "extra": {"gpu_idle_between_batches": 0.02}}],
            "gpu_by_mode": {
                "decode": {"busy_share": 0.4, "gap_before_share": 0.01, "tokens": 9, "mfu": 0.2},
                "prefill": {
                    "busy_share": 0.58,
                    "gap_before_share": 0.01,
                    "tokens": 9,
                    "mfu": 0.8,
                    "gaps": 40,
                    "longest_gaps_ms": [350.25, 12.0],
                },
            },
            "bf16_matmul_tflops": 800.0,
            "achieved_tflops": 460.0,
        },
        "grammar-8b": {"ratio_vs_unconstrained": {"all": 0.975, "half": 0.99}},
        "cold-start": {
            "triton/first_ever": {"ready_s": 30.0, "phases": {"imports": 9.0}},
            "triton/warm_caches": {"ready_s": 14.0, "phases": {"imports": 6.0}},
            "triton/warm_caches_2": {"ready_s": 15.5, "phases": {"imports": 6.5}},
        },
    }
    for name, contents in files.items():
        (out / f"{name}.json").write_text(json.dumps(contents))
    (out / "gpu.txt").write_text("NVIDIA H200, 143771 MiB, 570.00\n")


def test_collect_reads_each_driver_and_flags_what_got_worse(headline, tmp_path, capsys):
    recorded = recorded_copy(tmp_path)
    write_runs(tmp_path)
    result = headline.collect(tmp_path, recorded)
    figures = {k: v["values"][0] for k, v in result["figures"].items()}
    assert figures["8b-bs1-ms"] == pytest.approx(4.0)
    assert figures["8b-bs64-mbu"] == pytest.approx(73.0)
    assert figures["fp8-vs-bf16"] == pytest.approx(1.6)
    assert figures["offline-mfu"] == pytest.approx(57.5)
    assert figures["offline-idle"] == pytest.approx(2.0)
    assert figures["grammar-all"] == pytest.approx(0.975)
    # every warm start of the call (COLD_START_WARM_RUNS), the first-ever start left out
    assert result["figures"]["cold-start-ready"]["values"] == [14.0, 15.5]
    assert result["figures"]["cold-start-imports"]["values"] == [6.0, 6.5]
    # the stages that did not run have no figure
    assert "1b-bs1-ms" not in figures and "moe-bs64-mbu" not in figures
    assert json.loads((tmp_path / "headline.json").read_text()) == result
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == (
        "=== offline by mode: decode 40.0% of the device time, MFU 20.0%, idle before it 1.00%; "
        "prefill 58.0% of the device time, MFU 80.0%, idle before it 1.00% (40 gaps, the "
        "longest 350.2, 12.0 ms)"
    )
    lines = {line.split()[1]: line for line in out[3:-1]}
    assert "WORSE by 15%" in lines["offline-tok-s"]  # 25,000 against 29,510 at the least
    assert "WORSE" not in lines["8b-bs1-ms"]  # 4.0 against 3.945: within 5%
    assert "not run" in lines["1b-bs1-mbu"]
    assert "misses the target" in lines["offline-mfu"]
    assert "misses" not in lines["grammar-all"]
    assert (
        "14.0-15.5" in lines["cold-start-ready"]
        and "misses the target" in lines["cold-start-ready"]
    )


def test_record_makes_runs_the_recorded_spread_and_renders_the_page(headline, tmp_path):
    recorded = recorded_copy(tmp_path)
    page = tmp_path / "benchmarks.md"
    page.write_text(f"intro\n{headline.BEGIN}\nold table\n{headline.END}\nrest\n")
    runs = []
    for i, value in enumerate((0.972, 0.981)):
        run = tmp_path / f"run{i}.json"
        run.write_text(json.dumps({"figures": {"grammar-all": {"values": [value]}}}))
        runs.append(run)
    headline.record(runs, "2026-12-05, one H200", recorded, page)
    data = json.loads(recorded.read_text())
    assert data["figures"]["grammar-all"]["values"] == [0.972, 0.981]
    assert data["figures"]["8b-bs1-ms"]["values"] == [3.945]  # not measured: kept
    text = page.read_text()
    assert text.startswith("intro\n") and text.endswith("rest\n") and "old table" not in text
    assert headline.docs_table(text) == headline.render(data)
    row = next(line for line in text.splitlines() if line.startswith("| Constrained"))
    assert "0.972-0.981x unconstrained" in row and row.endswith("| yes |")
