"""Messages between the front end (TokenizerManager) and the scheduler process.

Small picklable dataclasses sent over pyzmq. Token ids cross the boundary, never text the
scheduler would have to re-tokenize; outputs carry only the tokens new since the last message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixserve.metrics.stats import SchedulerStats
from radixserve.sampling.sampling_params import SamplingParams


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


@dataclass
class AbortReq:
    rid: str


@dataclass
class FlushCacheReq:
    pass


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


@dataclass
class BatchReqOutput:
    outputs: list[ReqOutput]
    stats: SchedulerStats | None = None
