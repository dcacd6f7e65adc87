"""Hermes-style calls, as Qwen2.5, Qwen3 and Hermes models write them:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call, content before (and rarely between) the blocks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from radixserve.frontend.openai.tool_parsers.base import ParsedDelta, ToolCall, ToolParser
from radixserve.frontend.openai.tool_parsers.json_reader import CallObjectReader
from radixserve.frontend.openai.tool_parsers.scanning import ScanningParser

START = "<tool_call>"
END = "</tool_call>"


class HermesParser(ScanningParser, ToolParser):
    name = "hermes"

    def _step(self, out: ParsedDelta) -> bool:
        if self._state == "content":
            if not self._content_until(out, START):
                return False
            self._start_call(CallObjectReader())
            self._state = "call"
            return True
        if self._state == "call":
            status = self._read_call(out, START)
            if status == "more":
                return False
            self._state = "end_tag" if status == "done" else "content"
            return True
        # end_tag: the closing tag is optional (a model may stop right after the JSON)
        if not self._lstrip() or self._waits_for(END):
            return False
        if self._buf.startswith(END):
            self._buf = self._buf[len(END) :]
        elif END.startswith(self._buf):  # the output ended inside the closing tag
            self._buf = ""
        self._state = "content"
        return True

    @classmethod
    def format_calls(cls, calls: Sequence[ToolCall]) -> str:
        return "\n".join(
            f"{START}\n"
            + json.dumps({"name": call.name, "arguments": call.arguments_object()})
            + f"\n{END}"
            for call in calls
        )

    @classmethod
    def instructions(cls) -> str:
        return (
            "For each function call, return a JSON object with the function name and its "
            f"arguments within {START}{END} XML tags:\n"
            f'{START}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{END}'
        )
