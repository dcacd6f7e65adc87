"""`bench offline`'s breakdown of the device's time by forward mode (issue 39: the prefill share
apart from the decode share, and busy time apart from the gaps): shares of the run's device span,
tokens, and each mode's own MFU."""

from __future__ import annotations

import pytest

from radixserve.bench.offline import breakdown, breakdown_lines, gaps_since


def test_shares_of_the_span_and_each_modes_mfu() -> None:
    modes = {
        "prefill": {
            "busy_ms": 600.0,
            "gap_before_ms": 10.0,
            "tokens": 20_000,
            "gaps": 4,
            "longest_gaps_ms": [7.004, 1.5],
        },
        "decode": {"busy_ms": 380.0, "gap_before_ms": 10.0, "tokens": 2_000, "gaps": 90},
    }
    rows = breakdown(modes, params=8e9, peak=800.0)
    assert rows["prefill"]["busy_share"] == pytest.approx(0.6)
    assert rows["decode"]["gap_before_share"] == pytest.approx(0.01)
    assert sum(r["busy_share"] + r["gap_before_share"] for r in rows.values()) == pytest.approx(1)
    # 20k tokens x 16 GFLOP in 0.6 s: 533 TFLOP/s of 800; 2k decode tokens in 0.38 s: 84
    assert rows["prefill"]["mfu"] == pytest.approx(2 / 3)
    assert rows["decode"]["mfu"] == pytest.approx(2_000 * 2 * 8e9 / 0.38 / 1e12 / 800)
    lines = breakdown_lines(rows)
    assert lines[0].split() == [
        "mode", "device", "time", "idle", "before", "tokens", "MFU", "gaps", "longest", "gaps",
        "(ms)",
    ]  # fmt: skip
    assert lines[1].split()[:2] == ["decode", "38.0%"] and lines[2].startswith("prefill")
    # how many gaps and the longest: a few long ones are a stall, many short ones host work
    assert lines[1].split()[-2:] == ["90", "—"]
    assert lines[2].split()[-3:] == ["4", "7.0,", "1.5"]
    assert rows["prefill"]["longest_gaps_ms"] == [7.0, 1.5]


def test_the_runs_longest_gaps_are_those_the_warm_up_did_not_have() -> None:
    # the server's five longest before the run (warm-up) and after it; an equal value in both
    # lists is the warm-up's once
    assert gaps_since([0.4, 0.3], [30.0, 12.5, 0.4, 0.4, 0.3]) == [30.0, 12.5, 0.4]
    assert gaps_since([], [2.0]) == [2.0] and gaps_since([0.4], [0.4]) == []


def test_without_a_measured_peak_there_is_no_mfu() -> None:
    rows = breakdown({"decode": {"busy_ms": 5.0, "tokens": 64}}, params=1e9, peak=None)
    assert "mfu" not in rows["decode"] and rows["decode"]["gap_before_share"] == 0.0
    assert breakdown_lines(rows)[1].split()[4] == "—"
