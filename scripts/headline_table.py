"""The headline figures of issue 39: what each one is, where `scripts/gpu/headline.sh` finds it
in its drivers' JSON, the last recorded values (benchmarks/headline.json) and the table of
docs/benchmarks.md, which is rendered from that file so that the page never drifts from what
was measured.

One owner for the figures: the device script only runs the drivers and calls `collect`; the
lead records a run with `record`, which rewrites both the JSON and the page's table.

  python3 scripts/headline_table.py collect OUT_DIR    # on the device, after the stages: reads
      the drivers' JSON in OUT_DIR, writes OUT_DIR/headline.json and prints each figure beside
      the last recorded value and the target
  python3 scripts/headline_table.py record RUN.json [RUN.json ...]   # here: the runs' values
      (several runs give the spread) replace the recorded ones they measured; the page's table
      is rendered again
  python3 scripts/headline_table.py check              # the page's table is the rendered one

Standard library only: it runs on the device beside the drivers and here without torch.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "benchmarks" / "headline.json"
DOCS = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"
# a figure this much worse than the worst recorded run is flagged (machines differ by up to
# 10%, runs on one machine by a few percent)
WORSE_BY = 0.05

Runs = dict[str, Any]  # driver JSON file name (without .json) -> its contents
# what a figure's extract finds: one value, several (repeats within the call), or nothing
Found = float | list[float] | None


@dataclass(frozen=True)
class Figure:
    """One number of the headline table: where it comes from and what it must reach."""

    id: str
    row: str  # the table row it belongs to (figures of one row share a cell)
    unit: str  # printed after the value ("ms", "% MBU", "x bf16")
    digits: int
    extract: Callable[[Runs], Found]
    higher_is_better: bool
    target: float | None = None  # None: no bar of its own (a row's time beside its MBU)

    def format(self, value: float) -> str:
        text = f"{value:,.{self.digits}f}"
        return f"{text}{'' if self.unit[0] in '%x' else ' '}{self.unit}"

    def meets(self, value: float) -> bool | None:
        if self.target is None:
            return None
        return value >= self.target if self.higher_is_better else value <= self.target

    def target_text(self) -> str:
        if self.target is None:
            return ""
        sign = "≥" if self.higher_is_better else "≤"
        return f"{sign} {self.format(self.target)}"


def _latency_row(name: str, bs: int, key: str, scale: float) -> Callable[[Runs], float | None]:
    """A `radixserve bench latency` row's value (its JSON: rows, one per batch size)."""

    def extract(runs: Runs) -> float | None:
        rows = runs.get(name, {}).get("rows", [])
        row = next((r for r in rows if r["bs"] == bs), None)
        return None if row is None else row[key] * scale

    return extract


def _fp8_speedup(runs: Runs) -> float | None:
    bf16 = _latency_row("latency-8b", 1, "decode_step_s", 1.0)(runs)
    fp8 = _latency_row("latency-8b-fp8", 1, "decode_step_s", 1.0)(runs)
    return None if bf16 is None or fp8 is None else bf16 / fp8


def _offline(key: str) -> Callable[[Runs], float | None]:
    """A `radixserve bench offline` figure: total tok/s, MFU % or GPU idle % between batches."""

    def extract(runs: Runs) -> float | None:
        run = runs.get("offline-8b")
        if run is None:
            return None
        ours = run["results"][0]
        if key == "total_tok_s":
            return ours["total_tok_s"]
        if key == "mfu":  # bench offline's own formula: achieved / measured bf16 rate
            peak = run.get("bf16_matmul_tflops")
            return None if peak is None else 100 * run["achieved_tflops"] / peak
        idle = ours["extra"].get("gpu_idle_between_batches")
        return None if idle is None else 100 * idle

    return extract


def _grammar(runs: Runs) -> float | None:
    run = runs.get("grammar-8b")
    return None if run is None else run["ratio_vs_unconstrained"]["all"]


def _cold_start(key: str) -> Callable[[Runs], Found]:
    """cold_start.py's starts with the kernel caches warm (the issue's figure; several with
    COLD_START_WARM_RUNS), page cache dropped: seconds to /ready, or their `imports` phase.
    Triton's on the device; a CPU dry run has only torch_native's."""

    def extract(runs: Runs) -> Found:
        run = runs.get("cold-start", {})
        starts = [
            start
            for name, start in run.items()
            if name.split("/")[0] in ("triton", "torch_native")
            and name.split("/")[-1].startswith("warm_caches")
        ]
        if key == "ready":
            return [start["ready_s"] for start in starts]
        return [start["phases"]["imports"] for start in starts if "imports" in start["phases"]]

    return extract


def _latency_pair(row: str, name: str, bs: int, mbu: float, what: str = "MBU") -> list[Figure]:
    """A decode row's step time and MBU (`bench latency`: decode_step_s, decode_mbu)."""
    slug = f"{name.removeprefix('latency-')}-bs{bs}"
    digits = 3 if bs == 1 else 2
    return [
        Figure(
            f"{slug}-ms", row, "ms", digits, _latency_row(name, bs, "decode_step_s", 1e3), False
        ),
        Figure(
            f"{slug}-mbu",
            row,
            f"% {what}",
            1,
            _latency_row(name, bs, "decode_mbu", 100.0),
            True,
            mbu,
        ),
    ]


FIGURES: list[Figure] = [
    *_latency_pair("Llama-3-8B shape, batch-1 decode step", "latency-8b", 1, 89.0),
    *_latency_pair("same, `--quantization fp8`", "latency-8b-fp8", 1, 85.0, "of the FP8 floor"),
    Figure("fp8-vs-bf16", "same, `--quantization fp8`", "x bf16", 2, _fp8_speedup, True, 1.75),
    *_latency_pair("Llama-3.2-1B shape, batch-1 decode step", "latency-1b", 1, 80.0),
    *_latency_pair("Llama-3-8B shape, batch-64 decode step", "latency-8b", 64, 82.0),
    *_latency_pair(
        "Qwen3-30B-A3B shape (MoE), batch-1 decode step",
        "latency-moe",
        1,
        70.0,
        "MBU of the active experts",
    ),
    *_latency_pair("same, batch 64", "latency-moe", 64, 82.0),
    Figure(
        "offline-tok-s",
        "Offline, 8B shape, 1000 requests (256-1024 in, 64-256 out)",
        "total tok/s",
        0,
        _offline("total_tok_s"),
        True,
    ),
    Figure(
        "offline-mfu",
        "Offline, 8B shape, 1000 requests (256-1024 in, 64-256 out)",
        "% MFU",
        1,
        _offline("mfu"),
        True,
        65.0,
    ),
    Figure(
        "offline-idle",
        "Offline, 8B shape, 1000 requests (256-1024 in, 64-256 out)",
        "% GPU idle between batches",
        1,
        _offline("idle"),
        False,
        1.0,
    ),
    Figure(
        "grammar-all",
        "Constrained decoding, batch 64, every row (bench_grammar.py's JSON Schema, 8B shape)",
        "x unconstrained",
        3,
        _grammar,
        True,
        0.97,
    ),
    Figure(
        "cold-start-ready",
        "Cold start, 8B safetensors, page cache dropped, kernel caches warm, triton, to /ready",
        "s",
        1,
        _cold_start("ready"),
        False,
        15.0,
    ),
    Figure(
        "cold-start-imports",
        "Cold start, 8B safetensors, page cache dropped, kernel caches warm, triton, to /ready",
        "s imports",
        1,
        _cold_start("imports"),
        False,
    ),
]
BY_ID = {f.id: f for f in FIGURES}


def rows() -> list[tuple[str, list[Figure]]]:
    """The figures grouped by table row, in order."""
    grouped: dict[str, list[Figure]] = {}
    for figure in FIGURES:
        grouped.setdefault(figure.row, []).append(figure)
    return list(grouped.items())


def spread(figure: Figure, values: list[float]) -> str:
    """One run's value, or the lowest and highest of several ("29,510-29,951 total tok/s");
    runs that print alike print once."""
    low, high = figure.format(min(values)), figure.format(max(values))
    if low == high:
        return low
    return f"{low.split(' ')[0].rstrip('%x')}-{high}"


def met(figures: list[Figure], recorded: dict[str, list[float]]) -> str:
    """Whether the row's bars are met: by every recorded value, by none, or in part."""
    verdicts = [figure.meets(v) for figure in figures for v in recorded.get(figure.id, [])]
    verdicts = [v for v in verdicts if v is not None]
    if not verdicts:
        return "—"
    if all(verdicts):
        return "yes"
    return "no" if not any(verdicts) else "in part"


def render(data: dict[str, Any]) -> str:
    """The markdown table of docs/benchmarks.md for benchmarks/headline.json's contents."""
    values: dict[str, list[float]] = {k: v["values"] for k, v in data["figures"].items()}
    lines = [
        f"Recorded: {data['measured']}. Command: `{data['command']}`.",
        "",
        "| what is measured | recorded | target | met |",
        "|---|---|---|---|",
    ]
    for row, figures in rows():
        cells = [spread(f, values[f.id]) for f in figures if values.get(f.id)]
        targets = [f.target_text() for f in figures if f.target is not None]
        lines.append(
            f"| {row} | {', '.join(cells) or 'not recorded'} | {', '.join(targets) or '—'} "
            f"| {met(figures, values)} |"
        )
    return "\n".join(lines)


def docs_table(text: str) -> str:
    """The text between the page's markers."""
    match = re.search(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), text, flags=re.DOTALL)
    if match is None:
        raise ValueError(f"the page has no {BEGIN} ... {END} block")
    return match.group(1).removesuffix("\n")


def with_table(text: str, table: str) -> str:
    """The page with `table` between its markers."""
    docs_table(text)  # the markers are there
    return re.sub(
        re.escape(BEGIN) + r"\n.*?" + re.escape(END),
        lambda _: f"{BEGIN}\n{table}\n{END}",
        text,
        flags=re.DOTALL,
    )


def load_runs(out_dir: Path) -> Runs:
    """The drivers' JSON files the stages wrote (a stage that did not run wrote none)."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json"))}


def measure(runs: Runs) -> dict[str, list[float]]:
    """Every figure the runs hold, its values in the order measured."""
    found = {}
    for figure in FIGURES:
        try:
            value = figure.extract(runs)
        except (KeyError, IndexError, TypeError, ZeroDivisionError) as exc:
            print(f"{figure.id}: cannot read it from the drivers' JSON ({exc!r})", file=sys.stderr)
            continue
        values = value if isinstance(value, list) else [] if value is None else [value]
        if values:
            found[figure.id] = values
    return found


def compare(now: dict[str, list[float]], recorded: dict[str, list[float]]) -> list[str]:
    """Lines of a plain-text table: each figure now, last recorded, target, and a flag where it
    is more than WORSE_BY worse than every recorded run or misses its target."""

    def number(figure: Figure, values: list[float]) -> str:
        texts = [f"{v:,.{figure.digits}f}" for v in (min(values), max(values))]
        return texts[0] if len(values) == 1 else "-".join(texts)

    header = f"{'figure':<20}{'now':>14}{'recorded':>16}{'target':>10}  {'unit':<28}"
    lines = [header, "-" * len(header)]
    for figure in FIGURES:
        before = recorded.get(figure.id, [])
        values = now.get(figure.id, [])
        flags = []
        if values and before:
            pick = min if figure.higher_is_better else max
            worst_now, worst = pick(values), pick(before)
            change = (worst_now - worst) / worst if worst else 0.0
            if (change < -WORSE_BY) if figure.higher_is_better else (change > WORSE_BY):
                flags.append(f"WORSE by {100 * abs(change):.0f}%")
        if any(figure.meets(v) is False for v in values):
            flags.append("misses the target")
        target = figure.target_text().split(" ")[:2]
        lines.append(
            f"{figure.id:<20}{number(figure, values) if values else 'not run':>14}"
            f"{number(figure, before) if before else '-':>16}"
            f"{' '.join(target).rstrip('%x'):>10}  {figure.unit:<28}{', '.join(flags)}"
        )
    return lines


def collect(out_dir: Path, recorded_path: Path = RECORDED) -> dict[str, Any]:
    """Read the stages' JSON in `out_dir`, write `out_dir/headline.json` (benchmarks/headline.json's
    form) and print the comparison."""
    runs = load_runs(out_dir)
    runs.pop("headline", None)
    now = measure(runs)
    recorded = json.loads(recorded_path.read_text())
    gpu = (out_dir / "gpu.txt").read_text().strip() if (out_dir / "gpu.txt").exists() else "?"
    result = {
        "measured": f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {gpu}",
        "command": recorded["command"],
        "figures": {k: {"values": [round(v, 4) for v in vs]} for k, vs in now.items()},
    }
    (out_dir / "headline.json").write_text(json.dumps(result, indent=1) + "\n")
    before = {k: v["values"] for k, v in recorded["figures"].items()}
    print(f"=== headline figures; last recorded: {recorded['measured']}")
    for line in compare(now, before):
        print(f"=== {line}")
    modes = runs.get("offline-8b", {}).get("gpu_by_mode")
    if modes:
        print(f"=== offline by mode: {by_mode(modes)}")
    return result


def by_mode(modes: dict[str, dict[str, float]]) -> str:
    """`bench offline`'s device time by forward mode, one line: where the MFU goes."""
    parts = []
    for mode, row in modes.items():
        mfu = f", MFU {100 * row['mfu']:.1f}%" if "mfu" in row else ""
        longest = row.get("longest_gaps_ms")
        gaps = (
            f" ({row['gaps']} gaps, the longest {', '.join(f'{g:.1f}' for g in longest)} ms)"
            if longest
            else ""
        )
        parts.append(
            f"{mode} {100 * row['busy_share']:.1f}% of the device time{mfu}, "
            f"idle before it {100 * row['gap_before_share']:.2f}%{gaps}"
        )
    return "; ".join(parts)


def record(
    run_files: list[Path], measured: str, recorded_path: Path = RECORDED, docs_path: Path = DOCS
) -> None:
    """The runs' values replace the recorded values of the figures they measured (several runs,
    or repeats within one, give the spread); the page's table is rendered again."""
    data = json.loads(recorded_path.read_text())
    runs = [json.loads(p.read_text())["figures"] for p in run_files]
    for figure in FIGURES:
        values = [v for run in runs if figure.id in run for v in run[figure.id]["values"]]
        if values:
            data["figures"][figure.id] = {"values": values}
    data["measured"] = measured
    recorded_path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    docs_path.write_text(with_table(docs_path.read_text(), render(data)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("collect", help="the device's step: figures from OUT_DIR's JSON")
    p.add_argument("out_dir", type=Path)
    p = sub.add_parser("record", help="make runs the recorded values, render the page's table")
    p.add_argument("runs", type=Path, nargs="+")
    p.add_argument("--measured", required=True, help='e.g. "2026-12-05, one H200, commit abc1234"')
    sub.add_parser("check", help="whether docs/benchmarks.md carries the rendered table")
    args = parser.parse_args()
    if args.command == "collect":
        collect(args.out_dir)
    elif args.command == "record":
        record(args.runs, args.measured)
    else:
        expected = render(json.loads(RECORDED.read_text()))
        if docs_table(DOCS.read_text()) != expected:
            print(f"{DOCS}'s headline table is not the one {RECORDED} renders:\n{expected}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
