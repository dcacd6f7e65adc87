"""Anthropic's Messages API over the TokenizerManager's front door, independent of the HTTP
server, as `openai/serving.py` is for OpenAI's.

`prepare` validates a body, renders the conversation through the same `ChatTemplate`, tool
parser and reasoning parser as the OpenAI chat path (the `OpenAIServing` it is built on), maps
fields onto sampling params and runs `TokenizerManager.build_inputs`: every 400 is raised
before anything is admitted. The `PreparedRequest` then builds the whole message or yields its
stream events; the HTTP layer only writes them (`anthropic/http.py`).

A reply's content blocks come out of one `ChoiceOutput`, streamed or whole: `thinking` (the
reasoning parser's part), `text`, then a `tool_use` block per call. In a stream each block is
opened when its first piece is certain, and whitespace between calls opens no text block.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from radixserve.boundary import TokenizedGenerateReqInput
from radixserve.frontend.anthropic.protocol import (
    ANTHROPIC_PARAM_NAMES,
    ConversationRequest,
    CountTokensRequest,
    MessagesRequest,
)
from radixserve.frontend.openai.protocol import parse_request
from radixserve.frontend.openai.serving import (
    ChunkObserver,
    OpenAIServing,
    PreparedRequest,
    _observed,
    _prepend,
    _text_size,
)
from radixserve.frontend.openai.tool_calls import ChoiceOutput, forced_call_parser
from radixserve.frontend.openai.tool_parsers import (
    CallParser,
    ToolCall,
    ToolCallDelta,
    collect_calls,
)
from radixserve.frontend.tokenizer_manager import (
    INLINE_TOKENIZE_CHARS,
    GenerateChunk,
    GenerateRequest,
)


def new_tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def stop_reason(
    reason: dict[str, Any] | None, called_tools: bool, stop_sequences: list[str] | None
) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) of a finished output: `max_tokens` at the length limit,
    `tool_use` after calls, `stop_sequence` for a matched stop string, else `end_turn`."""
    if reason is None:
        return None, None
    if reason["type"] == "length":
        return "max_tokens", None
    if called_tools:
        return "tool_use", None
    matched = reason.get("matched")
    if isinstance(matched, str) and matched in (stop_sequences or []):
        return "stop_sequence", matched
    return "end_turn", None


def usage(chunk: GenerateChunk | None, output_tokens: int | None = None) -> dict[str, int]:
    """Anthropic's usage: `input_tokens` are the prompt tokens not read from the prefix cache,
    `cache_read_input_tokens` those that were (their sum is the prompt)."""
    if chunk is None:
        return {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0}
    return {
        "input_tokens": chunk.prompt_tokens - chunk.cached_tokens,
        "output_tokens": chunk.completion_tokens if output_tokens is None else output_tokens,
        "cache_read_input_tokens": chunk.cached_tokens,
    }


def tool_input(call: ToolCall) -> dict[str, Any]:
    """A call's arguments as the object Anthropic's `input` is (a value that is not an object,
    which no schema-following call writes, is kept under "arguments")."""
    value = call.arguments_object()
    return value if isinstance(value, dict) else {"arguments": value}


class AnthropicServing:
    def __init__(self, openai: OpenAIServing) -> None:
        self.openai = openai
        self.tm = openai.tm
        self.policy = openai.policy
        self.model_name = openai.model_name

    async def _prompt(self, req: ConversationRequest) -> tuple[str, list[int]]:
        messages = req.template_messages()
        args = (messages, req.template_tools(), self.openai.tool_parser, req.template_kwargs())
        render = self.openai.chat_template.render
        if _text_size(messages) <= INLINE_TOKENIZE_CHARS:
            prompt_text = render(*args)
        else:
            prompt_text = await self.tm.off_loop(render, *args)
        ids = await self.tm.encode(prompt_text, add_special_tokens=False, param="messages")
        return prompt_text, ids

    async def count_tokens(self, body: Any) -> dict[str, int]:
        req: CountTokensRequest = parse_request(CountTokensRequest, body, self.policy)
        self.openai.check_model(req.model)
        _, ids = await self._prompt(req)
        return {"input_tokens": len(ids)}

    async def prepare(
        self, body: Any, request_id: str, observe: ChunkObserver | None = None
    ) -> PreparedRequest:
        req: MessagesRequest = parse_request(MessagesRequest, body, self.policy)
        lora_name = self.openai.check_model(req.model)
        prompt_text, ids = await self._prompt(req)
        sampling = req.sampling_dict()
        tool_parser = self.openai.tool_parser
        family_parses = req.tools_offered and req.forced_tool is None
        reasoning_parser = self.openai.reasoning_parser
        if family_parses and tool_parser.keeps_special_tokens:
            sampling["skip_special_tokens"] = False
        if reasoning_parser is not None and reasoning_parser.keeps_special_tokens:
            sampling["skip_special_tokens"] = False  # its markers are special tokens
        inputs = await self.tm.build_inputs(
            GenerateRequest(
                prompts=[ids],
                sampling_params=[sampling],
                request_id=request_id,
                prompt_param="messages",
                sampling_param_names=ANTHROPIC_PARAM_NAMES,
                lora_name=lora_name,
            )
        )
        calls: CallParser | None = None
        if req.forced_tool is not None:
            calls = forced_call_parser(req.forced_tool)
        elif req.tools_offered:
            calls = tool_parser()
        reasoning = reasoning_parser(prompt_text) if reasoning_parser else None
        output = ChoiceOutput(reasoning, calls, req.parallel_tool_calls)
        run = _MessagesRun(self, req, inputs, f"msg_{request_id}", output, observe)
        return PreparedRequest(req.stream, run.response, run.events, 1)


class _MessagesRun:
    def __init__(
        self,
        serving: AnthropicServing,
        req: MessagesRequest,
        inputs: list[TokenizedGenerateReqInput],
        message_id: str,
        output: ChoiceOutput,
        observe: ChunkObserver | None,
    ) -> None:
        self.serving, self.req, self.inputs = serving, req, inputs
        self.message_id, self.output, self.observe = message_id, output, observe

    def _generate(self) -> AsyncIterator[tuple[int, GenerateChunk]]:
        stream = self.serving.tm.generate_many(self.inputs, param_names=ANTHROPIC_PARAM_NAMES)
        return stream if self.observe is None else _observed(stream, self.observe)

    def _message(
        self, content: list[dict[str, Any]], last: GenerateChunk | None, called_tools: bool
    ) -> dict[str, Any]:
        reason, sequence = stop_reason(
            last.finish_reason if last else None, called_tools, self.req.stop_sequences
        )
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.serving.openai.reply_model(self.req.model),
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage(last),
        }

    async def response(self) -> dict[str, Any]:
        texts: list[str] = []
        last: GenerateChunk | None = None
        stream = self._generate()
        async with contextlib.aclosing(stream):
            async for _, chunk in stream:
                texts.append(chunk.text)
                last = chunk
        reasoning, content, deltas = self.output.feed("".join(texts), final=True)
        calls = collect_calls(deltas)
        blocks: list[dict[str, Any]] = []
        if reasoning:
            blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
        if content or not (blocks or calls):
            blocks.append({"type": "text", "text": content})
        blocks += [
            {
                "type": "tool_use",
                "id": new_tool_use_id(),
                "name": call.name,
                "input": tool_input(call),
            }
            for call in calls
        ]
        return self._message(blocks, last, bool(calls))

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """message_start, each block's content_block_start / _delta / _stop, message_delta
        (stop reason and usage), message_stop."""
        blocks = _BlockStream()
        last: GenerateChunk | None = None
        stream = self._generate()
        async with contextlib.aclosing(stream):
            # Admission (a full queue, a request id in flight) fails on the first step: wait
            # for it before message_start, so such failures are plain error replies.
            first = await anext(stream)
            start = self._message([], None, False)
            start["usage"] = usage(first[1], output_tokens=0)
            yield {"type": "message_start", "message": start}
            async for _, chunk in _prepend(first, stream):
                last = chunk
                reasoning, content, deltas = self.output.feed(chunk.text, final=chunk.finished)
                for event in blocks.feed(reasoning, content, deltas):
                    yield event
        for event in blocks.finish():
            yield event
        reason, sequence = stop_reason(
            last.finish_reason if last else None, blocks.called_tools, self.req.stop_sequences
        )
        yield {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage(last),
        }
        yield {"type": "message_stop"}


class _BlockStream:
    """Opens, fills and closes content blocks as the pieces of an output arrive."""

    def __init__(self) -> None:
        self._index = -1
        self._open: str | None = None  # the open block's type
        self._call: int | None = None  # the call index of an open tool_use block
        self._held = ""  # whitespace that opens no text block by itself
        self.called_tools = False

    def _start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._stop()
        self._index += 1
        self._open = block["type"]
        events.append({"type": "content_block_start", "index": self._index, "content_block": block})
        return events

    def _stop(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        self._open = self._call = None
        return [{"type": "content_block_stop", "index": self._index}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self._index, "delta": delta}

    def feed(
        self, reasoning: str, content: str, deltas: list[ToolCallDelta]
    ) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if reasoning:
            if self._open != "thinking":
                events += self._start({"type": "thinking", "thinking": "", "signature": ""})
            events.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
        if content:
            if self._open == "text":
                events.append(self._delta({"type": "text_delta", "text": content}))
            elif not (self._held + content).strip():
                self._held += content
            else:
                text, self._held = self._held + content, ""
                events += self._start({"type": "text", "text": ""})
                events.append(self._delta({"type": "text_delta", "text": text}))
        for delta in deltas:
            if delta.name is not None:
                self.called_tools = True
                self._held = ""
                events += self._start(
                    {"type": "tool_use", "id": new_tool_use_id(), "name": delta.name, "input": {}}
                )
                self._call = delta.index
            if delta.arguments and self._call == delta.index:
                events.append(
                    self._delta({"type": "input_json_delta", "partial_json": delta.arguments})
                )
        return events

    def finish(self) -> list[dict[str, Any]]:
        events = self._stop()
        if self._index < 0:  # no block yet: one text block (perhaps empty), as a whole reply has
            events += self._start({"type": "text", "text": ""})
            if self._held:
                events.append(self._delta({"type": "text_delta", "text": self._held}))
            events += self._stop()
        return events
