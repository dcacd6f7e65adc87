"""OpenAI's request and response shapes, and their mapping onto radixserve's sampling params.

Requests are validated by pydantic in strict mode (a string is not an integer, `true` is not a
number) and unknown fields are refused, as the OpenAI API does; every problem becomes an
`OpenAIError` whose `param` names the offending field. Response builders are pure functions of
the collected text, token ids and logprobs, so they are unit-tested without a server.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from radixserve.api_errors import error_body
from radixserve.managers.io_struct import TokenLogprob
from radixserve.sampling.sampling_params import MAX_N

MAX_COMPLETION_LOGPROBS = 5
MAX_CHAT_TOP_LOGPROBS = 20


class OpenAIError(Exception):
    """An error the client caused or must retry; rendered as OpenAI's error JSON."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Request):
    include_usage: bool = False


class _SamplingFields(_Request):
    """Fields both endpoints share; the extensions (top_k, min_p, ...) follow vLLM and SGLang."""

    model: str
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: int | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    # Extensions.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = Field(None, ge=0)
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    stop_token_ids: list[int] | None = None

    def sampling_dict(self, max_new_tokens: int) -> dict[str, Any]:
        """Keyword arguments for `SamplingParams.from_dict` (nulls mean defaults)."""
        if self.logit_bias:
            raise OpenAIError("logit_bias is not supported", param="logit_bias")
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        return {
            "max_new_tokens": max_new_tokens,
            "min_new_tokens": self.min_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "repetition_penalty": self.repetition_penalty,
            "stop": stop,
            "stop_token_ids": self.stop_token_ids,
            "ignore_eos": self.ignore_eos,
            "skip_special_tokens": self.skip_special_tokens,
            "seed": self.seed,
        }

    @property
    def include_usage_in_stream(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def check_supported(self) -> None:
        if self.best_of is not None and self.best_of != self.n:
            raise OpenAIError("best_of other than n is not supported", param="best_of")
        if self.suffix:
            raise OpenAIError("suffix is not supported", param="suffix")
        if self.echo and self.logprobs is not None:
            raise OpenAIError("echo with logprobs (prompt logprobs) is not supported", param="echo")
        if isinstance(self.prompt, list) and not self.prompt:
            raise OpenAIError("prompt must not be empty", param="prompt")

    def prompts(self) -> list[str | list[int]]:
        """The batch of prompts: one string, several strings, one or several token lists."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


class TextContentPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None

    def template_dict(self) -> dict[str, str]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        # Templates know "system"; "developer" is OpenAI's newer name for it.
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content or ""}


class ResponseFormat(_Request):
    type: Literal["text"]


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_CHAT_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None

    def check_supported(self) -> None:
        if self.tools:
            raise OpenAIError("tools are not supported", param="tools")
        if self.tool_choice not in (None, "none"):
            raise OpenAIError("tool_choice is not supported", param="tool_choice")
        if self.top_logprobs and not self.logprobs:
            raise OpenAIError("top_logprobs needs logprobs: true", param="top_logprobs")

    @property
    def requested_max_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


def parse_request(model: type[_Request], body: Any) -> Any:
    """Validate a decoded JSON body, turning pydantic's report into one OpenAI error."""
    if not isinstance(body, dict):
        raise OpenAIError("the request body must be a JSON object")
    try:
        request = model.model_validate(body)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise OpenAIError(f"{param}: {first['msg']}", param=param) from None
    request.check_supported()
    return request


# ------------------------------------------------------------------------ responses


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def openai_finish_reason(reason: dict[str, Any] | None) -> str | None:
    """OpenAI knows "stop" and "length"; EOS, stop strings and stop tokens are all "stop"."""
    if reason is None:
        return None
    return "length" if reason["type"] == "length" else "stop"


def completion_logprobs(
    logprobs: Sequence[TokenLogprob],
    token_text: Callable[[int], str],
    text_offset_start: int = 0,
) -> dict[str, Any]:
    """The legacy completions shape: parallel lists of tokens, logprobs, top maps, offsets."""
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    offset = text_offset_start
    for entry in logprobs:
        text = token_text(entry.token_id)
        tokens.append(text)
        token_logprobs.append(entry.logprob)
        top_logprobs.append({token_text(t): lp for t, lp in entry.top})
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }


def chat_logprobs(
    logprobs: Sequence[TokenLogprob], token_text: Callable[[int], str]
) -> dict[str, Any]:
    def token_entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {
        "content": [
            {
                **token_entry(entry.token_id, entry.logprob),
                "top_logprobs": [token_entry(t, lp) for t, lp in entry.top],
            }
            for entry in logprobs
        ],
        "refusal": None,
    }


def completion_response(
    response_id: str, model: str, choices: list[dict[str, Any]], usage: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage,
    }


def completion_choice(
    index: int, text: str, logprobs: dict[str, Any] | None, finish_reason: str | None
) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_response(
    response_id: str, model: str, choices: list[dict[str, Any]], usage: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage,
    }


def chat_choice(
    index: int, text: str, logprobs: dict[str, Any] | None, finish_reason: str | None
) -> dict[str, Any]:
    return {
        "index": index,
        "message": {"role": "assistant", "content": text},
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }


def chat_chunk_choice(
    index: int,
    delta: dict[str, Any],
    logprobs: dict[str, Any] | None,
    finish_reason: str | None,
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


def stream_chunk(
    object_name: str,
    response_id: str,
    model: str,
    choices: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": object_name,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage,
    }


def model_card(model_id: str, max_model_len: int) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "radixserve",
        "max_model_len": max_model_len,
    }
