"""gpt-oss's harmony output through the chat path's parsers: the analysis channel becomes
`reasoning_content`, commentary messages to `functions.*` become tool calls, the final channel
(and commentary preambles) the answer; whole, and streamed in random splits (the stream must
rebuild the same result). Also: the family picks these parsers by default, and
`reasoning_effort` reaches the chat template."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.api_errors import InvalidParameterError
from radixserve.frontend.openai import protocol
from radixserve.frontend.openai.reasoning_parsers import (
    REASONING_PARSERS,
    default_reasoning_parser,
)
from radixserve.frontend.openai.tool_calls import ChoiceOutput
from radixserve.frontend.openai.tool_parsers import TOOL_PARSERS, collect_calls, default_tool_parser

PROMPT = "<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant"
ANALYSIS = "The user wants the weather in Paris. I should call get_weather, then answer."
ARGUMENTS = '{"city": "Paris", "unit": "celsius", "note": "<|x|> is text"}'
FINAL = "It is 21 °C and sunny in Paris."
# analysis, a call (recipient after the channel, with the json constraint), then the answer
COMPLETION = (
    f"<|channel|>analysis<|message|>{ANALYSIS}<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    f"<|message|>{ARGUMENTS}<|call|>"
    f"<|start|>assistant<|channel|>final<|message|>{FINAL}<|return|>"
)
# a preamble to the user, two calls (one with the recipient before the channel), a built-in
# tool's message (dropped: the server runs no browser), no end token after the last call
TWO_CALLS = (
    "<|channel|>analysis<|message|>Two lookups.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Checking both cities.<|end|>"
    '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>'
    '<|start|>assistant<|channel|>commentary to=browser.search<|message|>{"query": "x"}<|call|>'
    '<|start|>assistant<|channel|>commentary to=functions.get_time<|message|>{"tz": "CET"}'
)


def harmony_output(tools: bool = True) -> ChoiceOutput:
    calls = TOOL_PARSERS["harmony"]() if tools else None
    return ChoiceOutput(REASONING_PARSERS["harmony"](PROMPT), calls)


def run(text_pieces: list[str], tools: bool = True) -> tuple[str, str, list]:
    output = harmony_output(tools)
    reasoning = content = ""
    deltas = []
    for i, piece in enumerate(text_pieces):
        r, c, d = output.feed(piece, final=i == len(text_pieces) - 1)
        reasoning, content = reasoning + r, content + c
        deltas += d
    return reasoning, content, collect_calls(deltas)


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:], strict=False)] or [""]


def test_analysis_call_and_final_parse_whole():
    reasoning, content, calls = run([COMPLETION])
    assert reasoning == ANALYSIS
    assert content == FINAL
    assert [(c.name, c.arguments_object()) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius", "note": "<|x|> is text"})
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(COMPLETION)), max_size=40))
def test_streamed_in_random_chunks_gives_the_same_result(cuts):
    assert run(split(COMPLETION, cuts)) == run([COMPLETION])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, len(TWO_CALLS)), max_size=30))
def test_preamble_calls_and_builtin_tools_streamed(cuts):
    reasoning, content, calls = run(split(TWO_CALLS, cuts))
    assert reasoning == "Two lookups."
    assert content == "Checking both cities."
    assert [(c.name, c.arguments_object()) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_time", {"tz": "CET"}),
    ]


def test_cut_inside_a_call_drops_it_and_inside_analysis_keeps_the_reasoning():
    cut_call = COMPLETION[: COMPLETION.index('"unit"')]
    assert run([cut_call]) == (ANALYSIS, "", [])
    assert run([COMPLETION[:40]]) == (
        COMPLETION[len("<|channel|>analysis<|message|>") : 40],
        "",
        [],
    )


def test_without_tools_the_answer_is_the_final_channel_and_plain_text_stays_text():
    final_only = f"<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>{FINAL}"
    assert run([final_only], tools=False) == ("Easy.", FINAL, [])
    assert run(["Just text, no channels."], tools=False) == ("", "Just text, no channels.", [])


def test_the_family_picks_harmony_parsers_by_default():
    template = "{{- '<|start|>assistant<|channel|>final<|message|>' }}"
    assert default_tool_parser(template) == "harmony"
    assert default_reasoning_parser(template) == "harmony"
    assert default_reasoning_parser(None, ["<|channel|>"]) == "harmony"
    qwen = "{%- if tools %}<tool_call>{%- endif %}<|im_start|>"
    assert (default_tool_parser(qwen), default_reasoning_parser(qwen)) == ("hermes", None)
    assert REASONING_PARSERS["harmony"].keeps_special_tokens
    assert TOOL_PARSERS["harmony"].keeps_special_tokens


def test_history_calls_are_written_as_harmony_and_read_back():
    calls = run([COMPLETION])[2]
    written = TOOL_PARSERS["harmony"].format_calls(calls)
    assert run([written]) == ("", "", calls)


def test_reasoning_effort_reaches_the_chat_template():
    policy = protocol.FieldPolicy(strict=True)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    req = protocol.parse_request(
        protocol.ChatCompletionRequest, {**body, "reasoning_effort": "high"}, policy
    )
    assert req.chat_template_kwargs == {"reasoning_effort": "high"}
    # chat_template_kwargs names the variable itself: it wins
    req = protocol.parse_request(
        protocol.ChatCompletionRequest,
        {**body, "reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low"}},
        policy,
    )
    assert req.chat_template_kwargs == {"reasoning_effort": "low"}
    with pytest.raises(InvalidParameterError) as error:
        protocol.parse_request(
            protocol.ChatCompletionRequest, {**body, "reasoning_effort": "extreme"}, policy
        )
    assert error.value.param == "reasoning_effort"


# a harmony-shaped chat template: the server recognises the family by its channel marker
HARMONY_TEMPLATE = (
    "<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}<|end|>"
    "{%- if tools %}<|start|>developer<|message|># Tools"
    "{%- for tool in tools %} {{ tool.function.name }}{%- endfor %}<|end|>{%- endif %}"
    "{%- for m in messages %}<|start|>{{ m.role }}"
    "{%- if m.role == 'assistant' %}<|channel|>final{%- endif %}"
    "<|message|>{{ m.content }}<|end|>{%- endfor %}<|start|>assistant"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.mark.parametrize("stream", [False, True])
def test_server_picks_harmony_and_answers_with_reasoning_calls_and_content(
    smollm2_tokenizer, stream
):
    """Through the HTTP front end over a scripted model: no parser flags, yet the harmony
    parsers run (picked from the template), special tokens are kept, reasoning_effort renders."""
    import copy

    from scripted_server import MODEL, serve

    tokenizer = copy.deepcopy(smollm2_tokenizer)
    tokenizer.chat_template = HARMONY_TEMPLATE
    got: dict = {}

    async def test(client, session, tm):
        request = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [WEATHER],
            "reasoning_effort": "low",
        }
        if stream:
            reasoning = content = ""
            calls: dict[int, dict] = {}
            async for chunk in await client.chat.completions.create(**request, stream=True):
                for choice in chunk.choices:
                    delta = choice.delta
                    reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
                    content += delta.content or ""
                    for call in delta.tool_calls or []:
                        entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
                        entry["name"] += call.function.name or ""
                        entry["arguments"] += call.function.arguments or ""
                    if choice.finish_reason:
                        got["finish"] = choice.finish_reason
            got["calls"] = [(c["name"], c["arguments"]) for _, c in sorted(calls.items())]
        else:
            reply = await client.chat.completions.create(**request)
            message = reply.choices[0].message
            reasoning = message.model_extra["reasoning_content"]
            content = message.content
            got["calls"] = [(c.function.name, c.function.arguments) for c in message.tool_calls]
            got["finish"] = reply.choices[0].finish_reason
        got["reasoning"], got["content"] = reasoning, content
        got["prompt"] = tm.prompt_text(0)
        got["skip_special_tokens"] = tm.seen[0].sampling_params.skip_special_tokens

    serve(tokenizer, [COMPLETION], test)
    assert got["reasoning"] == ANALYSIS
    assert got["content"] == FINAL
    assert got["calls"] == [("get_weather", ARGUMENTS)]
    assert got["finish"] == "tool_calls"
    assert got["skip_special_tokens"] is False
    assert "Reasoning: low" in got["prompt"] and "# Tools get_weather" in got["prompt"]
