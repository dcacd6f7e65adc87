"""The names the front end and the scheduler process find each other by. Torch-free on purpose:
the front end makes them before it has imported torch, so that the scheduler process is
spawned at once and its imports overlap the front end's."""

from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class PortArgs:
    scheduler_input_ipc_name: str  # front end PUSH (connect) -> scheduler PULL (bind)
    tokenizer_ipc_name: str  # scheduler PUSH (connect) -> front end PULL (bind)

    @staticmethod
    def new() -> PortArgs:
        base = os.path.join(tempfile.gettempdir(), f"radixserve-{uuid.uuid4().hex[:12]}")
        return PortArgs(f"ipc://{base}-scheduler", f"ipc://{base}-tokenizer")

    def rank_ipc_name(self, rank: int) -> str:
        """Rank 0 PUSH (bind) -> rank `rank` PULL (connect): what rank 0 received, each step."""
        return f"{self.scheduler_input_ipc_name}-rank{rank}"
