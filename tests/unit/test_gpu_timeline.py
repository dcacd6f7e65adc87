"""GpuTimeline's bookkeeping of busy and idle device time, from event timestamps. The events
here are stand-ins that carry a time in ms (the CUDA events' `elapsed_time` is end - start)."""

from __future__ import annotations

from dataclasses import dataclass

from radixserve.scheduler.tp_worker import GpuTimeline


@dataclass
class Stamp:
    ms: float

    def elapsed_time(self, later: Stamp) -> float:
        return later.ms - self.ms


@dataclass
class Batch:
    started: Stamp | None
    done: Stamp | None


def batch(start: float, end: float) -> Batch:
    return Batch(Stamp(start), Stamp(end))


def test_gaps_count_only_while_work_is_queued_and_decode_pairs_apart() -> None:
    timeline = GpuTimeline()
    timeline.add(batch(0, 10), "prefill")  # a prefill: no gap before the first batch
    timeline.add(batch(13, 15), "decode")  # decode after prefill: a gap, not a decode gap
    timeline.add(batch(16, 18), "decode")  # decode after decode: 1 ms decode gap
    timeline.add(batch(18.5, 20.5), "decode")  # and 0.5 ms
    timeline.mark_idle()  # the queue ran dry: the pause until the next launch is not a gap
    timeline.add(batch(100, 102), "decode")
    timeline.add(batch(103, 110), "prefill")  # prefill after decode: a gap, not a decode gap
    timeline.add(batch(111, 112), "decode")
    assert timeline.busy_ms == 10 + 2 + 2 + 2 + 2 + 7 + 1
    assert timeline.gap_ms == 3 + 1 + 0.5 + 1 + 1
    assert timeline.decode_busy_ms == 2 + 2
    assert timeline.decode_gap_ms == 1 + 0.5


def test_busy_time_tokens_and_the_gaps_before_them_by_mode() -> None:
    timeline = GpuTimeline()
    timeline.add(batch(0, 10), "prefill", 4096)
    timeline.add(batch(12, 14), "decode", 64)  # 2 ms gap before a decode batch
    timeline.add(batch(14.5, 16.5), "decode", 64)
    timeline.add(batch(20, 28), "mixed", 2048)  # 3.5 ms before a mixed one
    timeline.add(batch(29, 31), "verify", 80)
    assert timeline.busy_ms_by_mode == {"prefill": 10, "decode": 4, "mixed": 8, "verify": 2}
    assert timeline.tokens_by_mode == {"prefill": 4096, "decode": 128, "mixed": 2048, "verify": 80}
    assert timeline.gap_ms_before_mode == {"decode": 2.5, "mixed": 3.5, "verify": 1}
    assert (timeline.busy_ms, timeline.gap_ms) == (24, 7)
    assert timeline.gap_count_before_mode == {"decode": 2, "mixed": 1, "verify": 1}
    assert timeline.longest_gaps_ms_before_mode == {
        "decode": [2, 0.5],
        "mixed": [3.5],
        "verify": [1],
    }
    timeline.reset()
    assert not timeline.busy_ms_by_mode and not timeline.tokens_by_mode


def test_batches_without_events_leave_the_timeline_alone() -> None:
    timeline = GpuTimeline()  # the CPU device records no events
    timeline.add(Batch(None, None), "decode")
    timeline.add(Batch(None, None), "decode")
    assert (timeline.busy_ms, timeline.gap_ms, timeline.decode_gap_ms) == (0.0, 0.0, 0.0)


def test_the_longest_gaps_kept_are_the_five_longest_longest_first() -> None:
    timeline = GpuTimeline()
    end = 0.0
    for gap in (1, 9, 2, 8, 3, 7, 4, 6):
        timeline.add(batch(end + gap, end + gap + 1), "prefill")
        end += gap + 1
    assert timeline.gap_count_before_mode == {"prefill": 7}  # the first batch has none before
    assert timeline.longest_gaps_ms_before_mode == {"prefill": [9, 8, 7, 6, 4]}
