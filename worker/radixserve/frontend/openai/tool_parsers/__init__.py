"""Tool-call parsers by model family, and the pick of a default for a model.

A parser turns model output into content and OpenAI tool calls, streamed or whole (see
`base.py`). `--tool-call-parser` names one; without it the chat template (and vocabulary)
tells which family a model belongs to. Torch-free, so the CLI can list the choices.
"""

from __future__ import annotations

from collections.abc import Iterable

from radixserve.frontend.openai.tool_parsers.base import (
    CallParser,
    CompleteCalls,
    ParsedDelta,
    ToolCall,
    ToolCallDelta,
    ToolParser,
    collect_calls,
    whole_arguments,
)
from radixserve.frontend.openai.tool_parsers.harmony import HarmonyToolParser
from radixserve.frontend.openai.tool_parsers.hermes import HermesParser
from radixserve.frontend.openai.tool_parsers.json_calls import JsonCallArray, NamedCallParser
from radixserve.frontend.openai.tool_parsers.llama3_json import Llama3JsonParser
from radixserve.frontend.openai.tool_parsers.mistral import MistralParser
from radixserve.frontend.openai.tool_parsers.pythonic import PythonicParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    parser.name: parser
    for parser in (HermesParser, Llama3JsonParser, MistralParser, PythonicParser, HarmonyToolParser)
}


# Markers a family's chat template (or vocabulary) carries, most specific first. A template
# with none of them (SmolLM2's, for one) gets the built-in tool template, in Hermes format.
_FAMILY_MARKERS = (
    ("<|channel|>", "harmony"),
    ("[TOOL_CALLS]", "mistral"),
    ("<|python_start|>", "pythonic"),
    ("<|python_tag|>", "llama3_json"),
    ("<tool_call>", "hermes"),
)
DEFAULT_TOOL_PARSER = "hermes"


def default_tool_parser(chat_template: str | None, special_tokens: Iterable[str] = ()) -> str:
    """The family's parser, recognised by the markers its template or vocabulary holds."""
    haystack = (chat_template or "") + "\n".join(special_tokens)
    for marker, parser in _FAMILY_MARKERS:
        if marker in haystack:
            return parser
    return DEFAULT_TOOL_PARSER


__all__ = [
    "DEFAULT_TOOL_PARSER",
    "TOOL_PARSERS",
    "CallParser",
    "CompleteCalls",
    "JsonCallArray",
    "NamedCallParser",
    "ParsedDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolParser",
    "collect_calls",
    "default_tool_parser",
    "whole_arguments",
]
