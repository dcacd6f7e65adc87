"""What every tool-call parser is: an incremental splitter of model output into content and calls.

A parser is fed the output text as it is generated and returns only what is certain: content
that can no longer turn into a call marker, the name of a call once it is complete, and the
arguments as they grow. `parse` (a whole, non-streamed output) is `feed(text)` then `finish()`,
so a streamed response and a non-streamed one cannot disagree: both go through one machine.

A parser streams a call's arguments as they grow; what reaches a client goes through
`CompleteCalls`, which holds each call until its parser is done with it and lets it out whole,
and only when its arguments are JSON: an output cut inside a call (at `max_tokens`) never
hands a client half of one.

A family's parser also knows how its models *write* calls (`format_calls`) and how to ask for
them (`instructions`): the built-in chat template uses both for models whose own template
cannot render tools (see `chat_template.py`).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass
class ToolCallDelta:
    """One streamed piece of call `index`: its first piece carries the name, every piece may
    carry a fragment of the arguments (JSON text)."""

    index: int
    name: str | None = None
    arguments: str = ""


@dataclass
class ParsedDelta:
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)

    def add(self, other: ParsedDelta) -> None:
        self.content += other.content
        self.calls.extend(other.calls)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI's `function.arguments`

    def arguments_object(self) -> Any:
        """The arguments as a value, or the text itself when it is not JSON."""
        try:
            return json.loads(self.arguments)
        except json.JSONDecodeError:
            return self.arguments


class CallParser(ABC):
    """Splits one output into content and tool calls, incrementally (see the module doc)."""

    @abstractmethod
    def feed(self, text: str) -> ParsedDelta:
        """Take the next piece of output; return what is now certain."""

    @abstractmethod
    def finish(self) -> ParsedDelta:
        """The output ended: release everything still held back."""

    @abstractmethod
    def open_call(self) -> int | None:
        """The index of the call still being read (its arguments may still grow), or None
        when the parser is inside no call: every call before it is complete."""

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """A whole output: its content and its complete calls (see `CompleteCalls`)."""
        delta = CompleteCalls(self).feed(text, final=True)
        return delta.content, collect_calls(delta.calls)


class ToolParser(CallParser):
    """A model family's call format: parsing it, writing it, and asking for it."""

    name: ClassVar[str]
    # True when the family's call markers are special tokens that detokenization must keep.
    keeps_special_tokens: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def format_calls(cls, calls: Sequence[ToolCall]) -> str:
        """The calls as this family's models write them (for history turns)."""

    @classmethod
    @abstractmethod
    def instructions(cls) -> str:
        """How to call a tool, as the built-in template tells a model."""


def collect_calls(deltas: Sequence[ToolCallDelta]) -> list[ToolCall]:
    """Join streamed pieces by index into whole calls, as OpenAI clients do."""
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for delta in deltas:
        if delta.name is not None:
            names[delta.index] = delta.name
        arguments.setdefault(delta.index, []).append(delta.arguments)
    return [ToolCall(names[i], "".join(arguments[i])) for i in sorted(names)]


class CompleteCalls:
    """A parser's calls as a client gets them: each one held until the parser is done with
    it, then let out whole (its name and all its arguments) as soon as it closes, so a
    client that joins a call's argument fragments never holds half of one.

    A call goes out only when its arguments are JSON (RFC 8259: no NaN or Infinity). A call
    the output ended inside (cut by `max_tokens`, or an EOS before it closed) goes out only
    when its arguments are already a whole JSON object or array; otherwise it is dropped,
    as is a closed call whose arguments are not JSON. Calls are numbered 0, 1, ... as they
    go out, at most `limit` of them (1 without parallel tool calls)."""

    def __init__(self, parser: CallParser, limit: int | None = None) -> None:
        self._parser = parser
        self._limit = limit
        self._names: dict[int, str] = {}
        self._arguments: dict[int, list[str]] = {}
        self.released = 0

    def feed(self, text: str, final: bool = False) -> ParsedDelta:
        """Content as the parser gives it, and the calls that are now complete; with `final`
        (the output's last text) the parser is finished and nothing stays held."""
        out = self._parser.feed(text)
        open_index = self._parser.open_call()
        if final:
            out.add(self._parser.finish())
        pieces, out.calls = out.calls, []
        for delta in pieces:
            if delta.name is not None:
                self._names[delta.index] = delta.name
            self._arguments.setdefault(delta.index, []).append(delta.arguments)
        for index in sorted(self._arguments):
            if index == open_index and not final:
                continue
            name = self._names.pop(index, None)
            arguments = "".join(self._arguments.pop(index))
            if name is None or not whole_arguments(arguments, closed=index != open_index):
                continue
            if self._limit is not None and self.released >= self._limit:
                continue
            out.calls.append(ToolCallDelta(self.released, name=name))
            out.calls.append(ToolCallDelta(self.released, arguments=arguments))
            self.released += 1
        return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def whole_arguments(arguments: str, closed: bool = True) -> bool:
    """Whether `arguments` is JSON a client can parse; for a call the parser never closed, a
    whole object or array (its closing bracket shows it complete: `12` may have been cut
    from `123`)."""
    try:
        value = json.loads(arguments, parse_constant=_no_constant)
    except ValueError:  # json.JSONDecodeError is one
        return False
    return closed or isinstance(value, dict | list)


class ContentStream:
    """Content text with its trailing whitespace held back, so the whitespace between content
    and a following call (or after the last call) never reaches the client."""

    def __init__(self) -> None:
        self._held = ""

    def add(self, text: str) -> str:
        combined = self._held + text
        kept = combined.rstrip()
        self._held = combined[len(kept) :]
        return kept

    def drop(self) -> None:
        self._held = ""

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


def held_prefix_length(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that could be the start of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0
