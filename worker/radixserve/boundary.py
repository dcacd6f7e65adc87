"""The boundary between the worker's two processes: the front end (`frontend/`: HTTP, the
protocols, the tokenizer) and the scheduler process (`scheduler/`: it owns the GPU).

Everything that crosses is here: the socket names the two find each other by (`PortArgs`, made
by the front end before it spawns the scheduler, so the spawn does not wait for any import)
and the messages, small picklable dataclasses sent over pyzmq. Token ids cross, never text the
scheduler would have to re-tokenize; outputs carry only the tokens new since the last message.
Torch-free: the front end imports it.
"""

from __future__ import annotations

import importlib
import os
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import Any

from radixserve.metrics.stats import SchedulerStats
from radixserve.read_ahead import watch_opened_files
from radixserve.sampling.sampling_params import SamplingParams


@dataclass
class PoolingParams:
    """Asks the scheduler for the prompt's pooled vector (embed) or score (rerank) instead of
    new tokens: the request is one prefill, answered with `ReqOutput.pooled`."""

    # Matryoshka: keep the first `dimensions` values of the embedding (normalised after the
    # cut when the model normalises); None keeps them all
    dimensions: int | None = None


@dataclass
class TokenizedGenerateReqInput:
    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    # Wall-clock arrival time in the front end (time.time()), for queue-time metrics.
    arrival_time: float = 0.0
    # set on an embedding or rerank model's requests: pool instead of sampling
    pooling: PoolingParams | None = None
    # the LoRA adapter the request's `model` names (None: the base model)
    lora_name: str | None = None


@dataclass
class AbortReq:
    rid: str


@dataclass
class GrammarsReadyReq:
    """Rank 0's word that these requests' grammars have compiled (or failed), so that every rank
    admits them in the same step (only sent with --tp-size > 1)."""

    rids: list[str]
    # rank 0's finished_reason for those whose compile failed, which every rank applies: a
    # compile's time limit can run out on rank 0 while another rank's compile succeeds
    failed: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class FlushCacheReq:
    pass


@dataclass
class LoRAAdapterReq:
    """Load (`path` given) or unload (`path` None) the LoRA adapter `name`; the reply carries
    `req_id` back (a load's reply comes when its read ends, maybe after later replies)."""

    name: str
    path: str | None = None
    req_id: str = ""


@dataclass
class LoRAAdapterReqOutput:
    """A load or unload's outcome; `adapters` (name -> path) is what is served after it."""

    success: bool
    message: str = ""
    adapters: dict[str, str] = field(default_factory=dict)
    req_id: str = ""


@dataclass
class StopRanksReq:
    """Rank 0's last message under --tp-size > 1: the other ranks leave their loop and take
    the process group down in order (never sent by the front end)."""


@dataclass
class FlushCacheReqOutput:
    success: bool
    message: str = ""


@dataclass
class GetServerInfoReq:
    pass


@dataclass
class GetServerInfoReqOutput:
    info: dict[str, Any]


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class ReqOutput:
    """What one request produced since its last ReqOutput (a delta)."""

    rid: str
    new_token_ids: list[int]
    finished_reason: dict[str, Any] | None  # {"type": "stop"|"length"|"abort"|"error", ...}
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    logprobs: list[TokenLogprob] | None = None
    # seconds between arrival at the scheduler and first scheduling, sent once
    queue_time: float | None = None
    # a pooling request's result, with its finish: the embedding, or the one score of a
    # rerank, as little-endian float32 bytes (OpenAI's base64 embeddings are these bytes)
    pooled: bytes | None = None


@dataclass
class BatchReqOutput:
    outputs: list[ReqOutput]
    stats: SchedulerStats | None = None


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


# The scheduler process's first message on its pipe to the front end, once its imports are
# done: the front end's weight read-ahead waits for it (catalog/checkpoint_files.py).
SCHEDULER_IMPORTED = "imported"

# The scheduler process's entry point, named rather than imported: importing it would load
# torch into the front end, which spawns it.
SCHEDULER_ENTRY_POINT = "radixserve.scheduler.scheduler_process:run_scheduler_process"


def run_scheduler_entry_point(*args: Any, **kwargs: Any) -> None:
    """The spawn target: the scheduler (torch and all) is imported in the new process, where
    its import time is measured as the `imports` phase, and every file it opens from here on
    is noted for the next start's read-ahead (read_ahead.py)."""
    watch_opened_files()
    module, name = SCHEDULER_ENTRY_POINT.split(":")
    getattr(importlib.import_module(module), name)(*args, **kwargs)
