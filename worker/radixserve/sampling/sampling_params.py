"""Per-request sampling parameters: what a client may ask for, checked before it reaches a batch.

Types are checked when a `SamplingParams` is built (so a malformed request never crosses the
IPC boundary); ranges are checked by `verify`, which needs the model's vocabulary size. Every
problem is an `InvalidParameterError` naming the field, which each API renames into its own
spelling (OpenAI's max_tokens, the native sampling_params.max_new_tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from radixserve.api_errors import InvalidParameterError

MAX_STOP_STRINGS = 16
MAX_N = 128
MAX_TEMPERATURE = 100.0
MAX_SEED = 2**64 - 1

_INT_FIELDS = ("max_new_tokens", "min_new_tokens", "top_k", "n")
_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)
_BOOL_FIELDS = ("ignore_eos", "skip_special_tokens")


def _is_int(value: Any) -> bool:
    """True for Python ints but not bools (JSON `true` must not pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0 means off
    min_p: float = 0.0
    frequency_penalty: float = 0.0  # OpenAI semantics, over generated tokens
    presence_penalty: float = 0.0  # OpenAI semantics, over generated tokens
    repetition_penalty: float = 1.0  # HF/CTRL semantics, over prompt + generated tokens
    stop: list[str] = field(default_factory=list)  # a single str is accepted and wrapped
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    n: int = 1
    seed: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if _is_int(value):
                setattr(self, name, float(value))
            elif not isinstance(value, float):
                raise InvalidParameterError(f"{name} must be a number, got {value!r}", name)
        for name in _INT_FIELDS:
            if not _is_int(getattr(self, name)):
                raise InvalidParameterError(
                    f"{name} must be an integer, got {getattr(self, name)!r}", name
                )
        for name in _BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise InvalidParameterError(
                    f"{name} must be a boolean, got {getattr(self, name)!r}", name
                )
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise InvalidParameterError(
                f"stop must be a string or a list of strings, got {self.stop!r}", "stop"
            )
        if not isinstance(self.stop_token_ids, list) or not all(
            _is_int(t) for t in self.stop_token_ids
        ):
            raise InvalidParameterError(
                f"stop_token_ids must be a list of integers, got {self.stop_token_ids!r}",
                "stop_token_ids",
            )
        if self.seed is not None and not _is_int(self.seed):
            raise InvalidParameterError(
                f"seed must be an integer or null, got {self.seed!r}", "seed"
            )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingParams:
        """Build from a request's JSON object. A null value means "use the default", as OpenAI
        clients send explicit nulls for parameters they leave unset."""
        if not isinstance(d, dict):
            raise InvalidParameterError(
                f"sampling_params must be an object, got {type(d).__name__}", "sampling_params"
            )
        known = {f.name for f in fields(cls)}
        for key in d:
            if key not in known:
                raise InvalidParameterError(f"unknown sampling parameter {key!r}", key)
        return cls(**{k: v for k, v in d.items() if v is not None})

    def verify(self, vocab_size: int) -> None:
        """Check every range; the message names the parameter and what it may be."""
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise InvalidParameterError(
                f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature}",
                "temperature",
            )
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidParameterError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.top_k < -1:
            raise InvalidParameterError(
                f"top_k must be -1 or 0 (off) or >= 1, got {self.top_k}", "top_k"
            )
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidParameterError(f"min_p must be in [0, 1], got {self.min_p}", "min_p")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise InvalidParameterError(
                    f"{name} must be in [-2, 2], got {getattr(self, name)}", name
                )
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise InvalidParameterError(
                f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}",
                "repetition_penalty",
            )
        if self.max_new_tokens < 0:
            raise InvalidParameterError(
                f"max_new_tokens must be >= 0, got {self.max_new_tokens}", "max_new_tokens"
            )
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise InvalidParameterError(
                f"min_new_tokens must be in [0, max_new_tokens={self.max_new_tokens}], "
                f"got {self.min_new_tokens}",
                "min_new_tokens",
            )
        if not 1 <= self.n <= MAX_N:
            raise InvalidParameterError(f"n must be in [1, {MAX_N}], got {self.n}", "n")
        for token_id in self.stop_token_ids:
            if not 0 <= token_id < vocab_size:
                raise InvalidParameterError(
                    f"stop_token_ids entries must be in [0, {vocab_size}), got {token_id}",
                    "stop_token_ids",
                )
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidParameterError(
                f"stop must hold at most {MAX_STOP_STRINGS} strings, got {len(self.stop)}",
                "stop",
            )
        if any(s == "" for s in self.stop):
            raise InvalidParameterError("stop strings must be non-empty", "stop")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise InvalidParameterError(f"seed must be in [0, 2**64), got {self.seed}", "seed")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1
