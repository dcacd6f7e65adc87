"""Call formats that are JSON only, with no family markers: what structured output makes a model
write when `tool_choice` forces calls, and the array Mistral's v3 models write after their marker.

The output is parsed as the JSON it is constrained to be, not through the family parser:

- `required`: an array of `{"name": ..., "parameters": {...}}` objects (`JsonCallArray`);
- a named function: the bare arguments object of that function (`NamedCallParser`).
"""

from __future__ import annotations

from radixserve.frontend.openai.tool_parsers.base import (
    CallParser,
    ContentStream,
    ParsedDelta,
    ToolCallDelta,
)
from radixserve.frontend.openai.tool_parsers.json_reader import CallObjectReader
from radixserve.frontend.openai.tool_parsers.scanning import ScanningParser


class JsonCallArray(ScanningParser):
    """`[{"name": ..., "arguments"|"parameters": ...}, ...]`: Mistral's v3 form after its marker,
    and what `tool_choice: required` makes any model write (structured output)."""

    initial_state = "array_start"

    def _step(self, out: ParsedDelta) -> bool:
        return self._array_step(out)

    def _array_step(self, out: ParsedDelta) -> bool:
        if self._state == "array_start":
            if not self._lstrip():
                return False
            if self._buf[0] != "[":
                self._state = "content"
                return True
            self._buf, self._state = self._buf[1:], "array"
            return True
        if self._state == "array":
            if not self._lstrip():
                return False
            head = self._buf[0]
            if head == ",":
                self._buf = self._buf[1:]
                return True
            if head == "]":
                self._buf, self._state = self._buf[1:], "content"
                return True
            if head != "{":
                self._state = "content"
                return True
            self._start_call(CallObjectReader())
            self._state = "array_call"
            return True
        if self._state == "array_call":
            status = self._read_call(out)
            if status == "more":
                return False
            self._state = "array" if status == "done" else "content"
            return True
        # content: whatever follows the array
        self._emit_content(out, self._buf)
        self._buf = ""
        return False


class NamedCallParser(CallParser):
    """The whole output is the arguments of the one function `tool_choice` names."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._arguments = ContentStream()
        self._started = False
        self._sent_any = False
        self._finished = False

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        if not self._started:
            self._started = True
            out.calls.append(ToolCallDelta(0, name=self._name))
        if not self._sent_any:
            text = text.lstrip()
        fragment = self._arguments.add(text)
        if fragment:
            self._sent_any = True
            out.calls.append(ToolCallDelta(0, arguments=fragment))
        return out

    def finish(self) -> ParsedDelta:
        out = self.feed("")
        self._finished = True
        if not self._sent_any:
            out.calls.append(ToolCallDelta(0, arguments="{}"))
        return out

    def open_call(self) -> int | None:
        """The one call is open until the output ends (the output is its arguments)."""
        return None if self._finished else 0
