"""The routing key of a request: its prompt as one string, what the prefix tree matches on.

The router has no tokenizer and no chat template (it never loads the model), so the key is
the prompt as the client wrote it: a completion's text, a chat's messages rendered role by
role (the template is a function of the messages in order, so equal message prefixes mean
equal token prefixes), or token ids mapped one id to one character, so that prefixes of ids
are prefixes of the key and the match ratio counts tokens. Anthropic's Messages (`system`,
then `messages`) and OpenAI's Responses (`instructions`, then `input`) render as the chat
messages they amount to, so the three APIs' equal conversations get equal keys (the worker
renders all three through one chat template). Requests that fill no cache (count_tokens, the
model list) get the empty key. Anything the router cannot read gets the empty key; the worker, not the router, tells the client what is wrong with it. The
one exception is JSON nested deeper than the parser's recursion limit: `BodyTooDeepError`,
which the router answers with 400 itself (no worker should have to parse it).
"""

from __future__ import annotations

import json
from typing import Any

_IDS_MARK = "\x00"  # token-id keys never share a prefix with text keys
_SURROGATES = 0xD800
_SURROGATES_END = 0xE000
_MAX_ID = 0x10FFFF - (_SURROGATES_END - _SURROGATES)


class BodyTooDeepError(ValueError):
    """The body's JSON nests deeper than the router parses."""


def routing_key(path: str, body: bytes) -> str:
    try:
        payload = json.loads(body) if body else None
    except RecursionError:
        raise BodyTooDeepError("the request body's JSON is nested too deeply") from None
    except (ValueError, UnicodeDecodeError):
        return ""
    if not isinstance(payload, dict):
        return ""
    if path == "/v1/chat/completions":
        return _chat_key(payload.get("messages"))
    if path == "/v1/completions":
        return _prompt_key(payload.get("prompt"))
    if path == "/generate":
        text = payload.get("text")
        return _prompt_key(text if text is not None else payload.get("input_ids"))
    if path == "/v1/messages":
        return _messages_key(payload.get("system"), payload.get("messages"))
    if path == "/v1/responses":
        return _responses_key(payload.get("instructions"), payload.get("input"))
    if path == "/v1/embeddings":
        return _prompt_key(payload.get("input"))
    if path in ("/v1/rerank", "/v1/score"):
        # a query's documents go where its prefix is cached
        return _prompt_key(payload.get("query", payload.get("text_1")))
    return ""


def ids_key(ids: list[Any]) -> str:
    """One character per token id (surrogate code points skipped); "" if any id is invalid."""
    chars = [_IDS_MARK]
    for token in ids:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token <= _MAX_ID:
            return ""
        chars.append(chr(token if token < _SURROGATES else token + _SURROGATES_END - _SURROGATES))
    return "".join(chars)


def _prompt_key(prompt: Any) -> str:
    """A string, token ids, or a batch of either (routed as one request: by its first prompt)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            return first
        if isinstance(first, list):  # a batch of token-id lists; deeper lists are no prompt
            return ids_key(first)
        return ids_key(prompt)
    return ""


def _turn(role: Any, text: str) -> str:
    return f"<{role}>{text}\n"


def _chat_key(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    parts = []
    for message in messages:
        if not isinstance(message, dict):
            return ""
        parts.append(_turn(message.get("role"), _content_text(message.get("content"))))
    return "".join(parts)


def _messages_key(system: Any, messages: Any) -> str:
    """Anthropic: `system` (a string or text blocks) as a system turn, then the messages."""
    if not isinstance(messages, list):
        return ""
    text = _content_text(system)
    return (_turn("system", text) if text else "") + _chat_key(messages)


def _responses_key(instructions: Any, items: Any) -> str:
    """OpenAI Responses: `instructions` as a system turn, then `input` (a string is one user
    message; items are messages, function calls and their outputs, each a turn)."""
    head = _turn("system", instructions) if isinstance(instructions, str) else ""
    if isinstance(items, str):
        return head + _turn("user", items)
    if not isinstance(items, list):
        return ""
    parts = [head]
    for item in items:
        if isinstance(item, str):
            parts.append(_turn("user", item))
        elif not isinstance(item, dict):
            return ""
        elif "role" in item:
            parts.append(_turn(item["role"], _content_text(item.get("content"))))
        elif item.get("type") == "function_call":
            parts.append(_turn("assistant", f"{item.get('name')}({item.get('arguments')})"))
        elif item.get("type") == "function_call_output":
            parts.append(_turn("tool", _content_text(item.get("output"))))
    return "".join(parts)


def _content_text(content: Any, blocks: bool = True) -> str:
    """A message's content as text: a string, or the text of its parts (the text parts of
    OpenAI's APIs; Anthropic's text blocks, and with `blocks` its tool calls' names and tool
    results' text)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif blocks and part.get("type") == "tool_use":
            parts.append(f"{part.get('name')}#{part.get('id')}")
        elif blocks and part.get("type") == "tool_result":
            parts.append(_content_text(part.get("content"), blocks=False))
    return "".join(parts)
