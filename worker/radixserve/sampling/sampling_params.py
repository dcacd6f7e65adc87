"""Per-request sampling parameters: what a client may ask for, checked before it reaches a batch.

Types are checked when a `SamplingParams` is built (so a malformed request never crosses the
IPC boundary); ranges are checked by `verify`, which needs the model's vocabulary size. Every
number that ends in a tensor is bounded here, in the front end (a top_k of 2**64 would overflow
an int64 tensor inside the scheduler): a bool is not a number, a float field takes no integer
beyond a float's range, NaN and infinities are outside every range. Every problem is an
`InvalidParameterError` naming the field, which each API renames into its own spelling
(OpenAI's max_tokens, the native sampling_params.max_new_tokens). A constraint (`json_schema`,
`regex` or `ebnf`) gets the cheap check the front end can make without torch
(catalog/constraint_kinds.py); the scheduler compiles it before the request is admitted.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Any

from radixserve.api_errors import InvalidParameterError
from radixserve.catalog.constraint_kinds import (
    CONSTRAINT_KINDS,
    surrogate_problem,
    validate_constraint,
)

MAX_STOP_STRINGS = 16
MAX_N = 128
MAX_TEMPERATURE = 100.0
MAX_SEED = 2**64 - 1
MAX_LOGIT_BIAS = 100.0
# the most new tokens any request may ask for, whatever the context (an int32 holds it)
MAX_NEW_TOKENS = 2**31 - 1

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
# a token id written as a JSON object key ("50256"); longer digit strings are no token id
_INTEGER = re.compile(r"\s*-?[0-9]{1,20}\s*")


def _is_int(value: Any) -> bool:
    """True for Python ints but not bools (JSON `true` must not pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _token_biases(value: Any) -> dict[int, float]:
    """logit_bias as {token id: bias}; JSON object keys arrive as strings ("50256": -100)."""
    if not isinstance(value, dict):
        raise InvalidParameterError(
            f"logit_bias must be an object of token id -> bias, got {value!r}", "logit_bias"
        )
    biases = {}
    for key, bias in value.items():
        token_id = int(key) if isinstance(key, str) and _INTEGER.fullmatch(key) else key
        if not _is_int(token_id):
            raise InvalidParameterError(
                f"logit_bias keys must be token ids (integers), got {key!r}", "logit_bias"
            )
        if not (_is_int(bias) or isinstance(bias, float)):
            raise InvalidParameterError(
                f"logit_bias values must be numbers, got {bias!r} for {key!r}", "logit_bias"
            )
        bias = _as_float(bias, "logit_bias")
        if math.isnan(bias):
            raise InvalidParameterError(
                f"logit_bias values must be numbers, got {bias!r} for {key!r}", "logit_bias"
            )
        biases[token_id] = bias
    return biases


def _as_float(value: int | float, name: str) -> float:
    """An int or float as a float; an integer beyond a float's range is refused, not raised."""
    try:
        return float(value)
    except OverflowError:
        raise InvalidParameterError(
            f"{name} must be a number in a float's range, got an integer of "
            f"{value.bit_length()} bits",
            name,
        ) from None


def _unicode_problem(name: str, texts: list[str]) -> None:
    for text in texts:
        problem = surrogate_problem(text)
        if problem is not None:
            raise InvalidParameterError(f"{name} {problem}", name)


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
    # constrained decoding: the output follows at most one of these (SGLang's spelling)
    json_schema: str | None = None  # a JSON Schema, as a JSON string
    regex: str | None = None
    ebnf: str | None = None  # xgrammar's EBNF (GBNF), with a `root` rule
    # token id -> added to its logit before sampling (OpenAI's logit_bias: -100 bans, +100 forces)
    logit_bias: dict[int, float] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if _is_int(value):
                setattr(self, name, _as_float(value, name))
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
        _unicode_problem("stop", self.stop)
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
        given = [kind for kind in CONSTRAINT_KINDS if getattr(self, kind) is not None]
        for kind in given:
            if not isinstance(getattr(self, kind), str):
                raise InvalidParameterError(
                    f"{kind} must be a string, got {getattr(self, kind)!r}", kind
                )
        if len(given) > 1:
            raise InvalidParameterError(
                f"{given[1]} cannot be combined with {given[0]}: give at most one of "
                "json_schema, regex and ebnf",
                given[1],
            )
        if self.logit_bias is not None:
            self.logit_bias = _token_biases(self.logit_bias)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingParams:
        """Build from a request's JSON object. A null value means "use the default", as OpenAI
        clients send explicit nulls for parameters they leave unset."""
        if not isinstance(d, dict):
            raise InvalidParameterError(
                f"sampling_params must be an object, got {type(d).__name__}", "sampling_params"
            )
        for key in d:
            if key not in SAMPLING_PARAM_FIELDS:
                raise InvalidParameterError(f"unknown sampling parameter {key!r}", key)
        return cls(**{k: v for k, v in d.items() if v is not None})

    def verify(self, vocab_size: int, max_new_tokens: int = MAX_NEW_TOKENS) -> None:
        """Check every range; the message names the parameter and what it may be.
        `max_new_tokens`: the most new tokens a request may ask for (the context length)."""
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise InvalidParameterError(
                f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature}",
                "temperature",
            )
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidParameterError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if not -1 <= self.top_k <= vocab_size:
            raise InvalidParameterError(
                f"top_k must be -1 or 0 (off) or in [1, {vocab_size}] (the vocabulary size), "
                f"got {self.top_k}",
                "top_k",
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
        limit = min(max_new_tokens, MAX_NEW_TOKENS)
        if not 0 <= self.max_new_tokens <= limit:
            context = " (the context length)" if limit < MAX_NEW_TOKENS else ""
            raise InvalidParameterError(
                f"max_new_tokens must be in [0, {limit}]{context}, got {self.max_new_tokens}",
                "max_new_tokens",
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
        for token_id, bias in (self.logit_bias or {}).items():
            if not 0 <= token_id < vocab_size:
                raise InvalidParameterError(
                    f"logit_bias keys must be token ids in [0, {vocab_size}), got {token_id}",
                    "logit_bias",
                )
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise InvalidParameterError(
                    f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], "
                    f"got {bias} for token {token_id}",
                    "logit_bias",
                )
        if self.constraint is not None:
            kind, text = self.constraint
            problem = validate_constraint(kind, text)
            if problem is not None:
                raise InvalidParameterError(f"{kind} {problem}", kind)
            if self.min_new_tokens > 0:
                # the grammar decides when the output may end; forbidding the end token earlier
                # could leave a row with no allowed token at all
                raise InvalidParameterError(
                    f"min_new_tokens cannot be combined with {kind}", "min_new_tokens"
                )

    @property
    def constraint(self) -> tuple[str, str] | None:
        """(kind, text) of the grammar the output must follow, if any."""
        for kind in CONSTRAINT_KINDS:
            text = getattr(self, kind)
            if text is not None:
                return kind, text
        return None

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


# the names a request's sampling_params object may use
SAMPLING_PARAM_FIELDS = frozenset(f.name for f in fields(SamplingParams))
