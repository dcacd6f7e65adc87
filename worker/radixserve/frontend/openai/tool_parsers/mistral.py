"""Mistral calls after the `[TOOL_CALLS]` control token, in either of Mistral's two forms:

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {...}]   (v3 tokenizers)
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}     (v11 and later)

The markers are special tokens, so detokenization keeps special tokens for this parser.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from radixserve.frontend.openai.tool_parsers.base import (
    ParsedDelta,
    ToolCall,
    ToolParser,
    held_prefix_length,
)
from radixserve.frontend.openai.tool_parsers.json_calls import JsonCallArray
from radixserve.frontend.openai.tool_parsers.json_reader import ValueReader

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_NAME = re.compile(r"[\w.-]{1,64}")


class MistralParser(JsonCallArray, ToolParser):
    name = "mistral"
    keeps_special_tokens = True
    initial_state = "content"

    def _step(self, out: ParsedDelta) -> bool:
        state = self._state
        if state == "content":
            if not self._content_until(out, TOOL_CALLS):
                return False
            self._state = "after_marker"
            return True
        if state == "after_marker":
            if not self._lstrip():
                return False
            self._state = "array_start" if self._buf[0] == "[" else "name"
            return True
        if state == "name":
            index = self._buf.find(ARGS)
            if index < 0:
                partial = self._buf[: len(self._buf) - held_prefix_length(self._buf, ARGS)]
                if not partial.strip() or _NAME.fullmatch(partial.strip()):
                    if self._final:  # the output ended inside the call's name: dropped
                        self._buf, self._state = "", "content"
                    return False
            name = self._buf[:index].strip()
            if index < 0 or not _NAME.fullmatch(name):
                self._emit_content(out, TOOL_CALLS + self._buf)
                self._buf, self._state = "", "content"
                return False
            self._buf = self._buf[index + len(ARGS) :]
            self._start_call(ValueReader(), name=name)
            self._state = "args"
            return True
        if state == "args":
            status = self._read_call(out)
            if status == "more":
                return False
            self._state = "content"
            return True
        if state in ("array_start", "array", "array_call"):
            return self._array_step(out)
        return False

    @classmethod
    def format_calls(cls, calls: Sequence[ToolCall]) -> str:
        array = [{"name": call.name, "arguments": call.arguments_object()} for call in calls]
        return TOOL_CALLS + json.dumps(array)

    @classmethod
    def instructions(cls) -> str:
        return (
            f"To call functions, respond with {TOOL_CALLS} followed by a JSON list of "
            '{"name": <function-name>, "arguments": <args-json-object>} objects.'
        )
