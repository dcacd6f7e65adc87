"""`POST /v1/responses` over the chat-completion path, and the stored responses.

`ResponsesServing.prepare` validates the request, prepends the stored conversation a
`previous_response_id` names, and hands the chat completion it amounts to
(`ResponsesRequest.chat_body`) to `OpenAIServing.prepare_chat`: the same validation, chat
template, tool and reasoning parsers, structured outputs and front door as
`/v1/chat/completions`. What comes back is reshaped: a whole chat completion into a Response
(`reasoning`, `message` and `function_call` output items), a chat stream into the Responses
API's typed events, each with its `sequence_number`:

    response.created, response.in_progress,
    per item: response.output_item.added, then
      a message:   response.content_part.added, response.output_text.delta...,
                   response.output_text.done, response.content_part.done
      a call:      response.function_call_arguments.delta..., .done
      reasoning:   response.reasoning_summary_part.added, response.reasoning_summary_text.delta...,
                   response.reasoning_summary_text.done, response.reasoning_summary_part.done
    response.output_item.done; finally response.completed (response.incomplete when the
    output ran into max_output_tokens, as OpenAI sends it).

With `store` (the default) the response and the conversation it answered are kept
(`store.py`) before the reply (or the last event) goes out.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from radixserve.api_errors import APIError, InvalidParameterError
from radixserve.frontend.openai.protocol import parse_request
from radixserve.frontend.openai.serving import ChunkObserver, OpenAIServing, PreparedRequest
from radixserve.frontend.openai_responses.protocol import (
    RESPONSE_ID,
    ItemSource,
    ResponsesRequest,
    not_found_error,
    parse_items,
)
from radixserve.frontend.openai_responses.store import make_store
from radixserve.server_args import ServerArgs


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class PreparedResponse:
    """A validated Responses request, ready to run: `response()` for a whole reply, `events()`
    for a stream; `error_event` turns a failure after the first event into the last one."""

    stream: bool
    response: Callable[[], Any]
    events: Callable[[], AsyncIterator[dict[str, Any]]]
    error_event: Callable[[APIError], dict[str, Any]]


class ResponsesServing:
    def __init__(self, chat: OpenAIServing, server_args: ServerArgs) -> None:
        self.chat = chat
        self.tm = chat.tm
        self.policy = chat.policy
        self.store = make_store(server_args.responses_store_size, server_args.responses_store_dir)

    async def prepare(
        self, body: Any, request_id: str, observe: ChunkObserver | None = None
    ) -> PreparedResponse:
        req: ResponsesRequest = parse_request(ResponsesRequest, body, self.policy)
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            stored = await self.store.get(req.previous_response_id)
            if stored is None:
                raise not_found_error(req.previous_response_id, "previous_response_id")
            history = [*stored["conversation"], *stored["response"]["output"]]
        source = ItemSource()
        chat_body = req.chat_body(parse_items(history), source)
        try:
            prepared = await self.chat.prepare_chat(chat_body, request_id, observe)
        except InvalidParameterError as exc:
            raise source.renamed(exc) from None
        run = _ResponseRun(self, req, prepared, [*history, *req.input_items()], source)
        return PreparedResponse(req.stream, run.response, run.events, run.error_event)

    async def retrieve(self, response_id: str) -> dict[str, Any]:
        stored = await self.store.get(response_id) if RESPONSE_ID.fullmatch(response_id) else None
        if stored is None:
            raise not_found_error(response_id)
        return stored["response"]

    async def delete(self, response_id: str) -> dict[str, Any]:
        deleted = RESPONSE_ID.fullmatch(response_id) and await self.store.delete(response_id)
        if not deleted:
            raise not_found_error(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def reasoning_tokens(self, reasoning: str, output_tokens: int) -> int:
        """How many of the output tokens were reasoning (its text re-tokenized)."""
        if not reasoning:
            return 0
        try:
            ids = await self.tm.encode(reasoning, add_special_tokens=False)
        except APIError:
            return output_tokens
        return min(len(ids), output_tokens)


# ---------------------------------------------------------------------------- output items


def message_item(
    item_id: str, text: str, status: str, logprobs: list[dict[str, Any]] | None
) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [part],
    }


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": text}],
        "status": status,
    }


def usage_of(chat_usage: dict[str, Any] | None, reasoning_tokens: int) -> dict[str, Any]:
    chat_usage = chat_usage or {}
    input_tokens = chat_usage.get("prompt_tokens", 0)
    output_tokens = chat_usage.get("completion_tokens", 0)
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }


class _ResponseRun:
    def __init__(
        self,
        serving: ResponsesServing,
        req: ResponsesRequest,
        prepared: PreparedRequest,
        conversation: list[dict[str, Any]],
        source: ItemSource,
    ) -> None:
        self.serving, self.req, self.prepared = serving, req, prepared
        self.conversation, self.source = conversation, source
        self.id = new_id("resp")
        self.created_at = int(time.time())
        self.sequence_number = 0

    def _response(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None,
    ) -> dict[str, Any]:
        finished = status in ("completed", "incomplete")
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": int(time.time()) if finished else None,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            "model": self.serving.chat.model_name,
            "output": output,
            "usage": usage,
            **self.req.echo_fields(),
        }

    async def _keep(self, response: dict[str, Any]) -> None:
        if self.req.store:
            stored = {"response": response, "conversation": self.conversation}
            await self.serving.store.put(self.id, stored)

    async def response(self) -> dict[str, Any]:
        try:
            chat = await self.prepared.response()
        except InvalidParameterError as exc:
            raise self.source.renamed(exc) from None
        choice = chat["choices"][0]
        message = choice["message"]
        incomplete = choice["finish_reason"] == "length"
        reasoning = message.get("reasoning_content") or ""
        content = message.get("content") or ""
        calls = message.get("tool_calls") or []
        logprobs = None
        if self.req.logprobs:
            logprobs = (choice.get("logprobs") or {}).get("content") or []
        output: list[dict[str, Any]] = []
        if reasoning:
            output.append(reasoning_item(new_id("rs"), reasoning, "completed"))
        if content or not (calls or reasoning):
            output.append(message_item(new_id("msg"), content, "completed", logprobs))
        for call in calls:
            function = call["function"]
            output.append(
                function_call_item(
                    new_id("fc"), call["id"], function["name"], function["arguments"], "completed"
                )
            )
        if incomplete:
            output[-1]["status"] = "incomplete"
        usage = chat.get("usage") or {}
        reasoning_tokens = await self.serving.reasoning_tokens(
            reasoning, usage.get("completion_tokens", 0)
        )
        response = self._response(
            "incomplete" if incomplete else "completed", output, usage_of(usage, reasoning_tokens)
        )
        await self._keep(response)
        return response

    # ------------------------------------------------------------------ streaming

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, **fields, "sequence_number": self.sequence_number}
        self.sequence_number += 1
        return event

    def error_event(self, error: APIError) -> dict[str, Any]:
        return self._event("error", code=error.code, message=error.message, param=error.param)

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        chat_events = self.prepared.events()
        items = _StreamedItems(self._event, self.req.logprobs)
        finish_reason = None
        usage: dict[str, Any] | None = None
        async with contextlib.aclosing(chat_events):
            try:
                # the first chunk comes once the request is admitted: a refusal before it is
                # a plain error reply, not an event
                first = await anext(chat_events)
            except InvalidParameterError as exc:
                raise self.source.renamed(exc) from None
            yield self._event("response.created", response=self._response("in_progress", [], None))
            yield self._event(
                "response.in_progress", response=self._response("in_progress", [], None)
            )
            chunk: dict[str, Any] | None = first
            while chunk is not None:
                usage = chunk.get("usage") or usage
                for choice in chunk["choices"]:
                    finish_reason = choice.get("finish_reason") or finish_reason
                    for event in items.feed(choice["delta"], choice.get("logprobs")):
                        yield event
                chunk = await anext(chat_events, None)
        incomplete = finish_reason == "length"
        for event in items.finish("incomplete" if incomplete else "completed"):
            yield event
        reasoning_tokens = await self.serving.reasoning_tokens(
            items.reasoning_text, (usage or {}).get("completion_tokens", 0)
        )
        status = "incomplete" if incomplete else "completed"
        response = self._response(status, items.output, usage_of(usage, reasoning_tokens))
        await self._keep(response)
        yield self._event(f"response.{status}", response=response)


class _StreamedItems:
    """Chat deltas as Responses output items: one item open at a time (reasoning, a message,
    or a function call), each opened and closed by its events."""

    def __init__(self, event: Callable[..., dict[str, Any]], logprobs: bool) -> None:
        self._event = event
        self._logprobs = logprobs
        self.output: list[dict[str, Any]] = []
        self.reasoning_text = ""
        self._open: dict[str, Any] | None = None
        self._call_index: int | None = None

    @property
    def _index(self) -> int:
        return len(self.output)

    def feed(self, delta: dict[str, Any], logprobs: dict[str, Any] | None) -> list[dict]:
        events: list[dict[str, Any]] = []
        if delta.get("reasoning_content"):
            events += self._reasoning(delta["reasoning_content"])
        entries = (logprobs or {}).get("content") or [] if self._logprobs else []
        if delta.get("content"):
            events += self._text(delta["content"], entries)
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            if function.get("name") is not None:
                events += self._call(call["index"], call["id"], function["name"])
            if function.get("arguments"):
                events += self._arguments(call["index"], function["arguments"])
        return events

    def _reasoning(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        item = self._open
        if item is None or item["type"] != "reasoning":
            events += self.close("completed")
            item = reasoning_item(new_id("rs"), "", "in_progress")
            item["summary"] = []
            self._open = item
            events.append(self._added(item))
            events.append(
                self._event(
                    "response.reasoning_summary_part.added",
                    item_id=item["id"],
                    output_index=self._index,
                    summary_index=0,
                    part={"type": "summary_text", "text": ""},
                )
            )
        item["text"] = item.get("text", "") + text
        self.reasoning_text += text
        events.append(
            self._event(
                "response.reasoning_summary_text.delta",
                item_id=item["id"],
                output_index=self._index,
                summary_index=0,
                delta=text,
            )
        )
        return events

    def _text(self, text: str, logprobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        item = self._open
        if item is None or item["type"] != "message":
            events += self.close("completed")
            events += self._open_message()
            item = self._open
        assert item is not None
        part = item["part"]
        part["text"] += text
        if self._logprobs:
            part["logprobs"].extend(logprobs)
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=self._index,
                content_index=0,
                delta=text,
                logprobs=logprobs,
            )
        )
        return events

    def _open_message(self) -> list[dict[str, Any]]:
        item = message_item(new_id("msg"), "", "in_progress", [] if self._logprobs else None)
        part = item["content"].pop()
        self._open = item
        added = self._added(item)
        item["part"] = part
        return [
            added,
            self._event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=self._index,
                content_index=0,
                part=dict(part),
            ),
        ]

    def _call(self, index: int, call_id: str, name: str) -> list[dict[str, Any]]:
        events = self.close("completed")
        item = function_call_item(new_id("fc"), call_id, name, "", "in_progress")
        self._open, self._call_index = item, index
        events.append(self._added(item))
        return events

    def _arguments(self, index: int, fragment: str) -> list[dict[str, Any]]:
        item = self._open
        if item is None or item["type"] != "function_call" or self._call_index != index:
            return []  # a fragment of a call already closed: calls stream one after another
        item["arguments"] += fragment
        return [
            self._event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=self._index,
                delta=fragment,
            )
        ]

    def _added(self, item: dict[str, Any]) -> dict[str, Any]:
        shown = {k: v for k, v in item.items() if k not in ("text", "part")}
        if item["type"] == "message":
            shown["content"] = []
        return self._event("response.output_item.added", output_index=self._index, item=shown)

    def close(self, status: str) -> list[dict[str, Any]]:
        """The events that finish the open item (none when none is open)."""
        item, self._open = self._open, None
        if item is None:
            return []
        index = self._index
        events: list[dict[str, Any]] = []
        if item["type"] == "reasoning":
            text = item.pop("text", "")
            part = {"type": "summary_text", "text": text}
            common = {"item_id": item["id"], "output_index": index, "summary_index": 0}
            events.append(self._event("response.reasoning_summary_text.done", **common, text=text))
            events.append(self._event("response.reasoning_summary_part.done", **common, part=part))
            item["summary"] = [part]
        elif item["type"] == "message":
            part = item.pop("part")
            common = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events.append(
                self._event(
                    "response.output_text.done",
                    **common,
                    text=part["text"],
                    logprobs=part.get("logprobs") or [],
                )
            )
            events.append(self._event("response.content_part.done", **common, part=part))
            item["content"] = [part]
        else:
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        item["status"] = status
        self.output.append(item)
        events.append(self._event("response.output_item.done", output_index=index, item=item))
        return events

    def finish(self, status: str) -> list[dict[str, Any]]:
        """Close the last item; a turn that produced nothing still answers one (empty)
        message, as a whole reply does."""
        if self._open is None and not self.output:
            return self._open_message() + self.close(status)
        return self.close(status)
