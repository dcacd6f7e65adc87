"""Llama 3.1+ JSON calls: an output that is a call starts with the JSON object (or Llama's
`<|python_tag|>`), several calls are separated by semicolons:

    {"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", ...}

An output that starts with anything else is content.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from radixserve.frontend.openai.tool_parsers.base import ParsedDelta, ToolCall, ToolParser
from radixserve.frontend.openai.tool_parsers.json_reader import CallObjectReader
from radixserve.frontend.openai.tool_parsers.scanning import ScanningParser

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonParser(ScanningParser, ToolParser):
    name = "llama3_json"
    keeps_special_tokens = True
    initial_state = "start"

    def _step(self, out: ParsedDelta) -> bool:
        if self._state == "start":
            head = self._buf.lstrip()
            if not head and not self._final:
                return False
            if head.startswith(PYTHON_TAG):
                self._buf, self._state = head[len(PYTHON_TAG) :], "calls"
            elif head.startswith("{"):
                self._buf, self._state = head, "calls"
            elif head and PYTHON_TAG.startswith(head) and not self._final:
                return False
            else:
                self._state = "content"
            return True
        if self._state == "content":
            self._emit_content(out, self._buf)
            self._buf = ""
            return False
        if self._state == "calls":
            if not self._lstrip():
                return False
            if self._buf[0] == ";":
                self._buf = self._buf[1:]
                return True
            if self._buf[0] != "{":
                self._state = "content"
                return True
            self._start_call(CallObjectReader())
            self._state = "call"
            return True
        status = self._read_call(out)  # call
        if status == "more":
            return False
        self._state = "calls" if status == "done" else "content"
        return True

    @classmethod
    def format_calls(cls, calls: Sequence[ToolCall]) -> str:
        return "; ".join(
            json.dumps({"name": call.name, "parameters": call.arguments_object()}) for call in calls
        )

    @classmethod
    def instructions(cls) -> str:
        return (
            "To call functions, respond only with JSON objects of the form "
            '{"name": <function-name>, "parameters": <args-json-object>}, '
            "separated by semicolons when you call several. Do not use variables."
        )
