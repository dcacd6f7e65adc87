"""Tool calling across a chat turn: what forces a call, and what reads one out of the output.

`tool_choice: auto` leaves the choice to the model, and the family's parser finds calls in
whatever it writes. `required` and a named function are enforced with structured output
(as vLLM does): the output is constrained by a JSON schema built from the tools' parameters,
and parsed as that JSON, not through the family parser:

- required: `[{"name": <one of the tools>, "parameters": <its arguments>}, ...]`, at least one
  call and at most `MAX_FORCED_CALLS` (exactly one without `parallel_tool_calls`): a weak
  model that repeats a call cannot loop until `max_tokens`, the grammar closes the array;
- named: the arguments object of that function (one call by construction).

Whatever the parser, a client gets a call only whole: `ChoiceOutput` lets each call out once
its parser is done with it, with arguments that are JSON, and drops a call the output was cut
inside (`CompleteCalls`).
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from radixserve.frontend.openai.reasoning_parsers import ReasoningDelta, ReasoningParser
from radixserve.frontend.openai.tool_parsers import (
    CallParser,
    CompleteCalls,
    JsonCallArray,
    NamedCallParser,
    ParsedDelta,
    ToolCallDelta,
)

# The most calls `tool_choice: required` lets one turn make when parallel calls are allowed.
MAX_FORCED_CALLS = 8


class FunctionSpec(Protocol):
    name: str

    def parameters_schema(self) -> dict[str, Any]: ...


def forced_tool_schema(
    functions: list[FunctionSpec], forced: str, parallel: bool
) -> dict[str, Any]:
    """The JSON schema that makes the model call a tool: `forced` is "required" or a name."""
    if forced != "required":
        function = next(f for f in functions if f.name == forced)
        return function.parameters_schema()
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [function.name]},
                "parameters": function.parameters_schema(),
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for function in functions
    ]
    return {
        "type": "array",
        "minItems": 1,
        "maxItems": MAX_FORCED_CALLS if parallel else 1,
        "items": {"anyOf": calls},
    }


def forced_call_parser(forced: str) -> CallParser:
    """The parser for output constrained by `forced_tool_schema(..., forced, ...)`."""
    return JsonCallArray() if forced == "required" else NamedCallParser(forced)


def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ChoiceOutput:
    """One choice's output on its way to the client: reasoning split off first, then tool
    calls out of the rest, each call whole (`CompleteCalls`: held until complete, dropped
    when the output ends inside it). Streamed or whole, the same steps run in the same
    order. Without `parallel_tool_calls` only the first complete call goes out."""

    def __init__(
        self,
        reasoning: ReasoningParser | None,
        calls: CallParser | None,
        parallel_tool_calls: bool = True,
    ) -> None:
        self._reasoning = reasoning
        self._calls = (
            CompleteCalls(calls, limit=None if parallel_tool_calls else 1) if calls else None
        )
        self.call_ids: list[str] = []

    @property
    def parses_reasoning(self) -> bool:
        return self._reasoning is not None

    def feed(self, text: str, final: bool = False) -> tuple[str, str, list[ToolCallDelta]]:
        """(reasoning, content, call deltas) that `text` makes certain; with `final` (the
        choice's last text) also whatever the parsers still held back. Each call comes whole
        in one feed: a delta with its name, then one with all its arguments (JSON)."""
        split = ReasoningDelta(content=text)
        if self._reasoning is not None:
            split = self._reasoning.feed(text)
            if final:
                split.add(self._reasoning.finish())
        parsed = ParsedDelta(content=split.content)
        if self._calls is not None:
            parsed = self._calls.feed(split.content, final)
        for delta in parsed.calls:
            if delta.name is not None:
                self.call_ids.append(new_tool_call_id())
        return split.reasoning, parsed.content, parsed.calls
