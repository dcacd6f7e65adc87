"""Reasoning parsers on recorded Qwen3 and DeepSeek-R1 outputs, whole and streamed in random
splits (the stream must rebuild the same reasoning and answer)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.frontend.openai.reasoning_parsers import REASONING_PARSERS, ReasoningDelta

QWEN3_PROMPT = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
# Qwen3 with enable_thinking: false closes an empty think block in the prompt.
QWEN3_NO_THINKING_PROMPT = QWEN3_PROMPT + "<think>\n\n</think>\n\n"
# Qwen3-2507 thinking and DeepSeek-R1-0528 templates open the block themselves.
OPEN_THINK_PROMPT = QWEN3_PROMPT + "<think>\n"
R1_PROMPT = "<｜User｜>What is 2+2?<｜Assistant｜>"

# (parser, prompt, output, reasoning, content)
RECORDED = [
    (
        "qwen3",
        QWEN3_PROMPT,
        "<think>\nThe user asks for 2+2. That is 4.\n</think>\n\n2 + 2 = **4**.",
        "\nThe user asks for 2+2. That is 4.\n",
        "2 + 2 = **4**.",
    ),
    ("qwen3", QWEN3_NO_THINKING_PROMPT, "2 + 2 = **4**.", None, "2 + 2 = **4**."),
    (
        "qwen3",
        QWEN3_PROMPT,
        "Plain answer: 4 (no <think> here).",
        None,
        "Plain answer: 4 (no <think> here).",
    ),
    (
        "qwen3",
        OPEN_THINK_PROMPT,
        "Simple arithmetic.\n</think>\n\nIt is 4.",
        "Simple arithmetic.\n",
        "It is 4.",
    ),
    (
        "qwen3",  # cut off by max_tokens while thinking: all of it is reasoning
        QWEN3_PROMPT,
        "<think>\nLet me count: one, two, thr",
        "\nLet me count: one, two, thr",
        "",
    ),
    (
        "deepseek-r1",
        R1_PROMPT,
        "Okay, 2+2 is basic addition, so 4.\n</think>\n\nThe answer is 4.",
        "Okay, 2+2 is basic addition, so 4.\n",
        "The answer is 4.",
    ),
    (
        "deepseek-r1",
        R1_PROMPT,
        "<think>\nOkay, 2+2=4.\n</think>\nThe answer is 4.",
        "\nOkay, 2+2=4.\n",
        "The answer is 4.",
    ),
    ("deepseek-r1", OPEN_THINK_PROMPT, "Hmm.</think>4", "Hmm.", "4"),
    ("deepseek-r1", QWEN3_NO_THINKING_PROMPT, "4", None, "4"),
]


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@pytest.mark.parametrize(("parser", "prompt", "output", "reasoning", "content"), RECORDED)
def test_recorded_outputs_split_whole(parser, prompt, output, reasoning, content):
    assert REASONING_PARSERS[parser](prompt).parse(output) == (reasoning, content)


@pytest.mark.parametrize(("parser", "prompt", "output", "reasoning", "content"), RECORDED)
@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(0, 10_000), max_size=30))
def test_streamed_in_random_splits_gives_the_same_split(
    parser, prompt, output, reasoning, content, cuts
):
    reasoner = REASONING_PARSERS[parser](prompt)
    total = ReasoningDelta()
    for piece in split(output, cuts):
        total.add(reasoner.feed(piece))
    total.add(reasoner.finish())
    assert (total.reasoning if reasoner.reasoned else None, total.content) == (reasoning, content)


def test_a_partial_end_tag_is_held_back_from_the_reasoning():
    reasoner = REASONING_PARSERS["qwen3"](QWEN3_PROMPT)
    assert reasoner.feed("<think>abc</th").reasoning == "abc"
    delta = reasoner.feed("ink>answer")
    assert (delta.reasoning, delta.content) == ("", "answer")
