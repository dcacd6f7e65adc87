"""Splitting a reasoning model's reasoning from its answer, streamed or whole: what every
reasoning parser is (`ReasoningParser`), and the `<think>...</think>` families' parser.

Whether the output *starts* inside the reasoning depends on the prompt: Qwen3's thinking
templates and DeepSeek-R1's open `<think>` in the generation prompt, so the model never writes
the opening tag; with `enable_thinking: false`, Qwen3's template closes an empty block instead.
The parser reads that from the rendered prompt. An opening tag at the very start of the output
enters the reasoning too. Like the tool parsers, a whole output is `feed` then `finish`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from radixserve.frontend.openai.tool_parsers.base import held_prefix_length


@dataclass
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""

    def add(self, other: ReasoningDelta) -> None:
        self.reasoning += other.reasoning
        self.content += other.content


class ReasoningParser(ABC):
    """Built per choice from the rendered prompt; fed the output, it returns what is certain
    to be reasoning and what is answer (the answer then goes on to the tool-call parser)."""

    name: ClassVar[str]
    # True when the family's markers are special tokens that detokenization must keep
    keeps_special_tokens: ClassVar[bool] = False
    reasoned: bool  # whether the output had a reasoning part at all

    @abstractmethod
    def __init__(self, prompt_text: str) -> None: ...

    @abstractmethod
    def feed(self, text: str) -> ReasoningDelta:
        """Take the next piece of output; return what is now certain."""

    @abstractmethod
    def finish(self) -> ReasoningDelta:
        """The output ended: release everything still held back."""

    def parse(self, text: str) -> tuple[str | None, str]:
        """A whole output: its reasoning (None when there was none) and its answer."""
        delta = self.feed(text)
        delta.add(self.finish())
        return (delta.reasoning if self.reasoned else None), delta.content


class ThinkTagParser(ReasoningParser):
    """Reasoning between think tags, then the answer (leading whitespace dropped)."""

    start_tag: ClassVar[str] = "<think>"
    end_tag: ClassVar[str] = "</think>"
    # Whether a prompt without any think tag leaves the model reasoning first.
    reasons_without_tags: ClassVar[bool] = False

    def __init__(self, prompt_text: str) -> None:
        self._buf = ""
        self._final = False
        self._reasoning_first = self._prompt_opens_reasoning(prompt_text)
        self._state = "start"
        self.reasoned = False  # whether the output had a reasoning part at all

    def _prompt_opens_reasoning(self, prompt_text: str) -> bool:
        opened = prompt_text.rfind(self.start_tag)
        closed = prompt_text.rfind(self.end_tag)
        if opened < 0 and closed < 0:
            return self.reasons_without_tags
        return opened > closed

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
        if self._state == "start":
            head = self._buf.lstrip()
            if not self._final and (not head or self.start_tag.startswith(head)):
                return False
            if head.startswith(self.start_tag):
                self._buf, self._state = head[len(self.start_tag) :], "reasoning"
            else:
                self._state = "reasoning" if self._reasoning_first else "content"
            self.reasoned = self._state == "reasoning"
            return True
        if self._state == "reasoning":
            index = self._buf.find(self.end_tag)
            if index >= 0:
                out.reasoning += self._buf[:index]
                self._buf, self._state = self._buf[index + len(self.end_tag) :], "answer_start"
                return True
            keep = 0 if self._final else held_prefix_length(self._buf, self.end_tag)
            out.reasoning += self._buf[: len(self._buf) - keep]
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        if self._state == "answer_start":
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._state = "content"
        out.content += self._buf
        self._buf = ""
        return False
