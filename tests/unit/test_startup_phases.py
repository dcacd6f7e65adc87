"""Start-up phase timing: phases add up where they happen and print in start-up order."""

from __future__ import annotations

import subprocess
import sys
import time

import torch

from radixserve.metrics.collectors import ServerMetrics
from radixserve.metrics.startup import StartupPhases, process_started_at
from radixserve.model_executor.model_runner import TimedIterator


def test_phases_accumulate_and_print_in_start_up_order():
    phases = StartupPhases()
    with phases.timed("kernel_warmup"):
        time.sleep(0.01)
    phases.add("imports", 2.0)
    phases.add("weight_read", 1.0)
    phases.add("weight_read", 0.5)
    assert phases.seconds["weight_read"] == 1.5
    assert phases.seconds["kernel_warmup"] >= 0.01
    summary = phases.summary()
    assert summary.index("imports") < summary.index("weight_read") < summary.index("kernel")
    assert summary.endswith(f"total {sum(phases.seconds.values()):.1f}s")


def test_timed_iterator_counts_only_the_producers_time():
    def slow_items():
        for i in range(3):
            time.sleep(0.02)
            yield str(i), torch.zeros(1)

    items = TimedIterator(slow_items())
    for _ in items:
        time.sleep(0.05)  # the consumer's time is not the reader's
    assert 0.06 <= items.seconds < 0.15


def test_phases_are_exported_with_a_total():
    metrics = ServerMetrics("m")
    metrics.set_startup({"imports": 1.0, "weight_read": 2.5})
    text = metrics.exposition().decode()
    assert 'radixserve_startup_seconds{model_name="m",phase="weight_read"} 2.5' in text
    assert 'radixserve_startup_seconds{model_name="m",phase="total"} 3.5' in text


def test_a_process_knows_when_it_started():
    """The `launch` phase starts at the process's start, before the interpreter ran a line."""
    before = time.time()
    child = subprocess.run(
        [sys.executable, "-c", "import time; time.sleep(0.3); "
         "from radixserve.metrics.startup import process_started_at; print(process_started_at())"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    started = float(child.stdout)
    # /proc counts in clock ticks (10 ms), so a tick of slack either side
    assert before - 0.02 <= started <= before + 0.25
    assert process_started_at() < before
