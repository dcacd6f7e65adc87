"""Reasoning parsers by name (`--reasoning-parser`): they split a model's thinking from its
answer into `reasoning_content` and `content`. Torch-free, so the CLI can list the choices."""

from __future__ import annotations

from radixserve.frontend.openai.reasoning_parsers.base import ReasoningDelta, ThinkTagParser


class Qwen3ReasoningParser(ThinkTagParser):
    """Qwen3 (and QwQ): reasoning only where the template or the model opens a think block."""

    name = "qwen3"


class DeepSeekR1ReasoningParser(ThinkTagParser):
    """DeepSeek-R1: the model reasons first even where its template does not show `<think>`."""

    name = "deepseek-r1"
    reasons_without_tags = True


REASONING_PARSERS: dict[str, type[ThinkTagParser]] = {
    parser.name: parser for parser in (Qwen3ReasoningParser, DeepSeekR1ReasoningParser)
}


__all__ = ["REASONING_PARSERS", "ReasoningDelta", "ThinkTagParser"]
