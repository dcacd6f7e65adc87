"""Where a worker's start-up time goes, phase by phase.

One `StartupPhases` per process collects durations as the start-up runs; the scheduler process
sends its phases with its ready message, and the front end adds its own, logs them on one line
and exports them as `radixserve_startup_seconds{phase}`. A cold start is what autoscaling waits
for, so each phase is measured where it happens, not estimated.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# in start-up order; a phase that did not run (no CUDA graphs on the CPU) is absent
PHASES = (
    "launch",  # the server process starting until it has spawned the scheduler process
    "imports",  # spawning the scheduler process and importing torch and the engine
    "model_check",  # the scheduler waiting for the front end's model check (past its imports)
    "model_setup",  # config and tokenizer of the checkpoint, the network built on the device
    "kv_allocation",  # the KV pool and request table
    "attention_backend",  # choosing and creating it: FlashInfer's import and module builds
    "cuda_graph_capture",  # before the weights: graphs hold the parameters' addresses
    "weight_read",  # reading the checkpoint (disk to host or device buffers)
    "host_to_device",  # copying the weights into the model's parameters
    "kernel_warmup",  # compiling and planning kernels for serving's shapes
    "ready",  # the scheduler is up until /ready answers 200
)


class StartupPhases:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - start)

    def update(self, other: dict[str, float]) -> None:
        for phase, seconds in other.items():
            self.add(phase, seconds)

    def summary(self) -> str:
        """One log line: each phase in start-up order, then the total."""
        parts = [f"{p} {self.seconds[p]:.1f}s" for p in PHASES if p in self.seconds]
        return ", ".join(parts) + f"; total {sum(self.seconds.values()):.1f}s"


def process_started_at() -> float | None:
    """When this process started, as `time.time()` would have said then (Linux's /proc): the
    interpreter's own start counts toward the cold start too. None where /proc is missing."""
    try:
        # fields after the command name (which may hold spaces); starttime is field 22
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    age_s = uptime_s - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return time.time() - age_s
