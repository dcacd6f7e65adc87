"""Reasoning parsers by name (`--reasoning-parser`): they split a model's thinking from its
answer into `reasoning_content` and `content`. Without the flag a family whose output always
needs splitting (gpt-oss's harmony channels) gets its own; the others get none. Torch-free, so
the CLI can list the choices."""

from __future__ import annotations

from collections.abc import Iterable

from radixserve.frontend.openai.harmony import CHANNEL
from radixserve.frontend.openai.reasoning_parsers.base import (
    ReasoningDelta,
    ReasoningParser,
    ThinkTagParser,
)
from radixserve.frontend.openai.reasoning_parsers.harmony import HarmonyReasoningParser


class Qwen3ReasoningParser(ThinkTagParser):
    """Qwen3 (and QwQ): reasoning only where the template or the model opens a think block."""

    name = "qwen3"


class DeepSeekR1ReasoningParser(ThinkTagParser):
    """DeepSeek-R1: the model reasons first even where its template does not show `<think>`."""

    name = "deepseek-r1"
    reasons_without_tags = True


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    parser.name: parser
    for parser in (Qwen3ReasoningParser, DeepSeekR1ReasoningParser, HarmonyReasoningParser)
}


def default_reasoning_parser(
    chat_template: str | None, special_tokens: Iterable[str] = ()
) -> str | None:
    """The family's parser where its output is never plain text (harmony, recognised by its
    channel marker in the template or vocabulary), else None: think tags stay opt-in."""
    haystack = (chat_template or "") + "\n".join(special_tokens)
    return HarmonyReasoningParser.name if CHANNEL in haystack else None


__all__ = [
    "REASONING_PARSERS",
    "ReasoningDelta",
    "ReasoningParser",
    "ThinkTagParser",
    "default_reasoning_parser",
]
