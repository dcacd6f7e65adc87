"""OpenAI's response shapes: pure functions of the collected text, calls and logprobs, so they
are unit-tested without a server."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from radixserve.boundary import TokenLogprob


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def openai_finish_reason(reason: dict[str, Any] | None, called_tools: bool = False) -> str | None:
    """OpenAI knows "stop", "length" and "tool_calls"; EOS, stop strings and stop tokens are
    all "stop", and a turn that stopped after calling tools is "tool_calls"."""
    if reason is None:
        return None
    if reason["type"] == "length":
        return "length"
    return "tool_calls" if called_tools else "stop"


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
    index: int,
    message: dict[str, Any],
    logprobs: dict[str, Any] | None,
    finish_reason: str | None,
) -> dict[str, Any]:
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }


def chat_message(
    content: str | None,
    tool_calls: list[dict[str, Any]] | None = None,
    reasoning_content: str | None = None,
    with_reasoning: bool = False,
) -> dict[str, Any]:
    """The assistant message; `reasoning_content` is shown when a reasoning parser runs."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if with_reasoning:
        message["reasoning_content"] = reasoning_content
    return message


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_call_delta(
    index: int, call_id: str | None, name: str | None, arguments: str
) -> dict[str, Any]:
    """A streamed piece of a call: the first carries id, type and name (and empty arguments),
    later ones only their argument fragment, as OpenAI streams them."""
    if name is not None:
        return {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
    return {"index": index, "function": {"arguments": arguments}}


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
