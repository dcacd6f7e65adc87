"""gpt-oss's tool calls, harmony messages to `functions.NAME` on the commentary channel:

    <|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris"}<|call|>

the form the harmony reasoning parser (`reasoning_parsers/harmony.py`) hands on, whatever order
and extras (`<|start|>assistant`, ` <|constrain|>json`) the model wrote the header with; raw
output in that form parses too. The arguments are one JSON value; the call ends at `<|call|>`
(or where the output ends).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from radixserve.frontend.openai.harmony import CALL, MESSAGE, call_header
from radixserve.frontend.openai.tool_parsers.base import (
    ParsedDelta,
    ToolCall,
    ToolParser,
    held_prefix_length,
)
from radixserve.frontend.openai.tool_parsers.json_reader import ValueReader
from radixserve.frontend.openai.tool_parsers.scanning import ScanningParser

CALL_START = call_header("").removesuffix(MESSAGE)  # <|channel|>commentary to=functions.
_NAME = re.compile(r"[\w.-]{1,64}")


class HarmonyToolParser(ScanningParser, ToolParser):
    name = "harmony"
    keeps_special_tokens = True

    def _step(self, out: ParsedDelta) -> bool:
        if self._state == "content":
            if not self._content_until(out, CALL_START):
                return False
            self._state = "name"
            return True
        if self._state == "name":
            index = self._buf.find(MESSAGE)
            if index < 0:
                if self._final:  # the output ended inside the call's header: dropped
                    self._buf, self._state = "", "content"
                return False
            name = self._buf[:index].split("<|")[0].strip()
            self._buf = self._buf[index + len(MESSAGE) :]
            if not _NAME.fullmatch(name):
                self._state = "skip"  # not a call a client could make: its body is dropped
                return True
            self._start_call(ValueReader(), name=name)
            self._state = "args"
            return True
        if self._state == "args":
            if self._read_call(out) == "more":
                return False
            self._state = "skip"
            return True
        # skip: whatever is left of the message, up to its end
        index = self._buf.find(CALL)
        if index < 0:
            self._buf = self._buf[len(self._buf) - held_prefix_length(self._buf, CALL) :]
            if self._final:
                self._buf = ""
            return False
        self._buf, self._state = self._buf[index + len(CALL) :], "content"
        return True

    @classmethod
    def format_calls(cls, calls: Sequence[ToolCall]) -> str:
        return "".join(f"{call_header(call.name)}{call.arguments}{CALL}" for call in calls)

    @classmethod
    def instructions(cls) -> str:
        return (
            "To call a function, write a message on the commentary channel to the function: "
            f"{call_header('<function-name>')}<args-json-object>{CALL}"
        )
