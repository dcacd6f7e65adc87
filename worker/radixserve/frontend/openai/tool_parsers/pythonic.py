"""Pythonic calls, as Llama 3.2 and Llama 4 write them: the output is a Python list of calls
with keyword arguments,

    [get_weather(city="Paris", unit="celsius"), get_time(zone='CET')]

optionally wrapped in Llama 4's `<|python_start|>` ... `<|python_end|>`. An output that does
not start with `[` is content. Arguments are Python literals, sent as JSON once a call is
complete (a partial Python literal has no JSON prefix to stream); a call the output ends
inside (cut at `max_tokens`) is dropped, as every family's is. Being Python, the format
has no way to write a function or argument named by a keyword (`[if()]` does not parse): such
a call stays content, as in vLLM's parser of the same name.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import Any

from radixserve.frontend.openai.tool_parsers.base import (
    ParsedDelta,
    ToolCall,
    ToolCallDelta,
    ToolParser,
)
from radixserve.frontend.openai.tool_parsers.scanning import ScanningParser

PYTHON_START = "<|python_start|>"
PYTHON_END = "<|python_end|>"
# what a call cut short can be: its name so far, or its name and an open argument list
_CALL_START = re.compile(r"[A-Za-z_]\w*(\s*\(.*)?", re.DOTALL)


class PythonicParser(ScanningParser, ToolParser):
    name = "pythonic"
    initial_state = "start"

    def __init__(self) -> None:
        super().__init__()
        self._element: list[str] = []
        self._depth = 0
        self._quote = ""
        self._escape = False
        self._raw = ""  # the list text read so far, given back as content if it is not calls

    def _step(self, out: ParsedDelta) -> bool:
        if self._state == "start":
            head = self._buf.lstrip()
            if head.startswith(PYTHON_START):
                head = head[len(PYTHON_START) :].lstrip()
            if head.startswith("["):
                self._buf, self._raw, self._state = head[1:], "[", "list"
                return True
            if (not head or PYTHON_START.startswith(head)) and not self._final:
                return False
            self._state = "content"
            return True
        if self._state == "list":
            return self._read_list(out)
        if self._state == "after_list":
            if not self._lstrip() or self._waits_for(PYTHON_END):
                return False
            if self._buf.startswith(PYTHON_END):
                self._buf = self._buf[len(PYTHON_END) :]
            elif PYTHON_END.startswith(self._buf):  # the output ended inside the closing tag
                self._buf = ""
            self._state = "content"
            return True
        self._emit_content(out, self._buf)  # content
        self._buf = ""
        return False

    def _read_list(self, out: ParsedDelta) -> bool:
        for i, ch in enumerate(self._buf):
            self._raw += ch
            if self._quote:
                self._track_string(ch)
                self._element.append(ch)
                continue
            if ch in "'\"":
                self._quote = ch
            elif ch in "([{":
                self._depth += 1
            elif ch in ")}" or (ch == "]" and self._depth > 0):
                self._depth -= 1
            elif self._depth == 0 and ch in ",]":
                rest = self._buf[i + 1 :]
                if not self._end_element(out):
                    self._buf, self._state = rest, "content"
                    return True
                if ch == "]":
                    self._buf, self._state = rest, "after_list"
                    return True
                continue
            self._element.append(ch)
        self._buf = ""
        if self._final:  # the list never closed: what is complete was calls, the rest is text
            source = "".join(self._element).strip()
            if _CALL_START.fullmatch(source) and _parse_call(source) is None:
                self._element = []  # a call the output ended inside (max_tokens): dropped
                return False
            if not self._end_element(out) and not self._num_calls:
                self._state = "content"
            return False
        return False

    def _track_string(self, ch: str) -> None:
        if self._escape:
            self._escape = False
        elif ch == "\\":
            self._escape = True
        elif ch == self._quote:
            self._quote = ""

    def _end_element(self, out: ParsedDelta) -> bool:
        """Parse the element just read; False when it is not a call (the list is text)."""
        source = "".join(self._element).strip()
        self._element = []
        if not source:
            return True
        call = _parse_call(source)
        if call is None:
            self._emit_content(out, self._raw if not self._num_calls else source)
            return False
        index = self._num_calls
        self._num_calls += 1
        out.calls.append(ToolCallDelta(index, name=call.name))
        out.calls.append(ToolCallDelta(index, arguments=call.arguments))
        return True

    @classmethod
    def format_calls(cls, calls: Sequence[ToolCall]) -> str:
        return "[" + ", ".join(_format_call(call) for call in calls) + "]"

    @classmethod
    def instructions(cls) -> str:
        return (
            "To call functions, respond only with a Python list of calls with keyword "
            "arguments, in the format [func_name1(param1=value1, param2=value2), "
            "func_name2(param=value)]."
        )


def _parse_call(source: str) -> ToolCall | None:
    try:
        node = ast.parse(source, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, ast.Name):
        return None
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            return None
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            return None
    try:
        return ToolCall(node.func.id, json.dumps(arguments))
    except TypeError:  # a literal JSON cannot hold (a set, bytes, a complex number)
        return None


def _format_call(call: ToolCall) -> str:
    arguments = call.arguments_object()
    if not isinstance(arguments, dict):
        arguments = {}
    return f"{call.name}(" + ", ".join(f"{k}={v!r}" for k, v in arguments.items()) + ")"
