"""The markers of gpt-oss's harmony format that its output parsers read: the reasoning parser
(`reasoning_parsers/harmony.py`, which splits the channels) and the tool-call parser
(`tool_parsers/harmony.py`, which reads the calls it hands on). Prompts are rendered by the
model's own chat template, which writes the same format."""

from __future__ import annotations

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
CALL = "<|call|>"
# what ends a message's body: its end tokens, or (a model that skipped them) the next message
ENDS = ("<|end|>", CALL, "<|return|>", START)
FUNCTIONS = "functions."


def call_header(name: str) -> str:
    """A call to tool `name` as the harmony tool parser reads it (its arguments and CALL next)."""
    return f"{CHANNEL}commentary to={FUNCTIONS}{name}{MESSAGE}"
