"""A serving process's cyclic garbage collector: the heap built at start frozen out of it, and
every collection timed.

CPython's full (generation 2) collection visits every tracked object, and the scheduler process
holds a few hundred thousand after its imports (torch, transformers, triton) and the model's
setup: one full collection took 125 ms of that process's single thread on the 2-vCPU machine,
and none of it can overlap the device's work, which the step loop keeps fed. Full collections
come whenever enough allocated objects survive (every few tens of thousands), so a long offline
run or a busy server pays them again and again, as GPU idle between batches. Nothing the
start-up built is garbage later, so `freeze_startup_heap` moves all of it to the permanent
generation (`gc.freeze`, as SGLang and vLLM do after start-up): collections then visit only
what serving allocated since.

`pause_stats` says what collections there were since, per generation, and how long they took,
so that a benchmark (bench offline) or an operator (server info) sees it if they come back.
Torch-free.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

logger = logging.getLogger(__name__)

GENERATIONS = 3
# a collection at least this long is logged as a warning: the step loop stood still for it
LONG_PAUSE_S = 0.05

_counts = [0] * GENERATIONS
_total_s = [0.0] * GENERATIONS
_longest_s = [0.0] * GENERATIONS
_started_at: float | None = None


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    global _started_at
    if phase == "start":
        _started_at = time.perf_counter()
        return
    if _started_at is None:  # installed between a collection's start and its stop
        return
    seconds = time.perf_counter() - _started_at
    _started_at = None
    generation = info["generation"]
    _counts[generation] += 1
    _total_s[generation] += seconds
    _longest_s[generation] = max(_longest_s[generation], seconds)
    if seconds >= LONG_PAUSE_S:
        logger.warning(
            "garbage collection of generation %d took %.0f ms (%d objects collected)",
            generation,
            seconds * 1e3,
            info["collected"],
        )


def freeze_startup_heap() -> int:
    """Collect what start-up left behind, move every object that survives to the permanent
    generation, and time every collection from now on. Call once, when the process is ready
    to serve. Returns the number of objects frozen."""
    gc.collect()
    gc.freeze()
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)
    frozen = gc.get_freeze_count()
    logger.info("froze %d objects of the start-up heap out of garbage collection", frozen)
    return frozen


def pause_stats() -> dict[str, Any]:
    """Collections since `freeze_startup_heap`, per generation ("0", "1", "2"): how many, their
    milliseconds in all and the longest; and the objects frozen."""
    return {
        "gc_frozen_objects": gc.get_freeze_count(),
        "gc_collections": {str(g): _counts[g] for g in range(GENERATIONS)},
        "gc_pause_ms": {str(g): round(_total_s[g] * 1e3, 3) for g in range(GENERATIONS)},
        "gc_longest_pause_ms": {str(g): round(_longest_s[g] * 1e3, 3) for g in range(GENERATIONS)},
    }
