"""gpt-oss's harmony output, split into reasoning, answer and tool calls, streamed or whole.

After the prompt's `<|start|>assistant` a gpt-oss model writes messages, each a header, a body
and an end:

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>
    <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>

The `analysis` channel is the model's reasoning (`reasoning_content`); the `final` channel and
commentary without a recipient (a preamble to the user) are the answer (`content`); a message
to `functions.NAME` is a call of that tool, which goes on to the tool-call parser (`harmony`,
`tool_parsers/harmony.py`) in the one form it reads:
`<|channel|>commentary to=functions.NAME<|message|>ARGUMENTS<|call|>`. Messages to the other
recipients (the built-in browser and python tools, which this server does not run) are dropped.
The markers are special tokens, so detokenization keeps them (`keeps_special_tokens`).
"""

from __future__ import annotations

import re
from typing import ClassVar

from radixserve.frontend.openai.harmony import (
    CALL,
    CHANNEL,
    ENDS,
    FUNCTIONS,
    MESSAGE,
    START,
    call_header,
)
from radixserve.frontend.openai.reasoning_parsers.base import ReasoningDelta, ReasoningParser
from radixserve.frontend.openai.tool_parsers.base import held_prefix_length

_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"([^\s<]+)")


class HarmonyReasoningParser(ReasoningParser):
    name: ClassVar[str] = "harmony"
    keeps_special_tokens: ClassVar[bool] = True

    def __init__(self, prompt_text: str) -> None:
        self._buf = ""
        self._final = False
        self._state = "header"
        self._route = "content"  # where the current body goes: reasoning, content, call, drop
        self.reasoned = False

    def feed(self, text: str) -> ReasoningDelta:
        self._buf += text
        out = ReasoningDelta()
        while self._step(out):
            pass
        return out

    def finish(self) -> ReasoningDelta:
        self._final = True
        return self.feed("")

    def _step(self, out: ReasoningDelta) -> bool:
        if self._state == "header":
            return self._header(out)
        index, end = self._body_end()
        if index < 0:
            keep = 0 if self._final else max(held_prefix_length(self._buf, e) for e in ENDS)
            self._route_text(out, self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        self._route_text(out, self._buf[:index])
        if self._route == "call":
            out.content += CALL
        self._buf = self._buf[index + (0 if end == START else len(end)) :]
        self._state = "header"
        return True

    def _header(self, out: ReasoningDelta) -> bool:
        """Read a header up to MESSAGE and pick where its body goes. Output that does not start
        with a marker (no harmony at all) is the answer as it stands."""
        head = self._buf.lstrip()
        if head and not head.startswith("<|") and not "<|".startswith(head):
            self._buf, self._state, self._route = head, "body", "content"
            return True
        index = self._buf.find(MESSAGE)
        if index < 0:
            if self._final:
                self._buf = ""  # the output ended inside a header
            return False
        header = self._buf[:index]
        self._buf = self._buf[index + len(MESSAGE) :]
        self._state = "body"
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        if recipient is not None:
            name = recipient.group(1)
            if name.startswith(FUNCTIONS):
                self._route = "call"
                out.content += call_header(name.removeprefix(FUNCTIONS))
            else:
                self._route = "drop"
        elif channel is not None and channel.group(1) == "analysis":
            self._route = "reasoning"
            self.reasoned = True
        else:
            self._route = "content"
        return True

    def _body_end(self) -> tuple[int, str]:
        """The first end marker in the buffer and where it is ((-1, "") for none)."""
        found = [(i, end) for end in ENDS if (i := self._buf.find(end)) >= 0]
        return min(found) if found else (-1, "")

    def _route_text(self, out: ReasoningDelta, text: str) -> None:
        if self._route == "reasoning":
            out.reasoning += text
        elif self._route in ("content", "call"):
            out.content += text
