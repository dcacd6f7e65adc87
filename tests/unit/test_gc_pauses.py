"""gc_pauses: the start-up heap frozen out of the cyclic collector, and each collection
after it timed per generation. In a subprocess: freezing and the collector's callbacks are
the whole interpreter's state."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import gc, json, logging, sys
logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="LOG %(message)s")
from radixserve import gc_pauses

startup_heap = [[i] for i in range(50_000)]
frozen = gc_pauses.freeze_startup_heap()
tracked = gc.get_objects()
still_tracked = any(o is startup_heap for o in tracked)
del tracked
before = gc_pauses.pause_stats()
gc_pauses.LONG_PAUSE_S = 0.0  # every collection from here on is logged as long
for _ in range(3000):
    cycle = []
    cycle.append(cycle)
gc.collect(2)
print("RESULT " + json.dumps({"frozen": frozen, "still_tracked": still_tracked, "before": before,
                  "after": gc_pauses.pause_stats()}), flush=True)
"""


def test_start_up_heap_is_frozen_and_later_collections_are_timed() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True
    )
    lines = proc.stdout.splitlines()
    result = json.loads(next(x for x in lines if x.startswith("RESULT "))[len("RESULT ") :])
    logs = [x for x in lines if x.startswith("LOG ")]
    assert result["frozen"] >= 50_000 and not result["still_tracked"]
    before, after = result["before"], result["after"]
    assert before["gc_collections"] == {"0": 0, "1": 0, "2": 0}
    assert after["gc_frozen_objects"] == result["frozen"]
    # 3,000 cycles of one list each pass gen 0's threshold (700) several times, then one full
    assert after["gc_collections"]["0"] >= 3 and after["gc_collections"]["2"] >= 1
    for gen in "012":
        assert 0 <= after["gc_longest_pause_ms"][gen] <= after["gc_pause_ms"][gen]
    assert any("garbage collection of generation 2 took" in line for line in logs), logs
