"""Tool-call parsers on outputs recorded from each family's models, whole and streamed in random
splits: a stream must rebuild exactly the calls and content of the whole output, in OpenAI's
delta shape (a call's first delta carries its name, later ones only argument fragments)."""

from __future__ import annotations

import json
import keyword

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.frontend.openai.tool_parsers import (
    TOOL_PARSERS,
    CallParser,
    JsonCallArray,
    NamedCallParser,
    ParsedDelta,
    ToolCall,
    collect_calls,
    default_tool_parser,
)

WEATHER_SF = ToolCall(
    "get_current_temperature", '{"location": "San Francisco, CA, USA", "unit": "celsius"}'
)
WEATHER_DATE = ToolCall(
    "get_temperature_date",
    '{"location": "San Francisco, CA, USA", "date": "2024-10-01", "unit": "celsius"}',
)

# (parser, recorded output, expected content, expected calls). The outputs are as the models
# write them (Qwen2.5/Qwen3 for hermes, Llama 3.1 for llama3_json, Mistral 7B v0.3 and Mistral
# Small 3.2 for mistral, Llama 3.2 and Llama 4 for pythonic), special tokens kept.
RECORDED = [
    (
        "hermes",
        '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": '
        '"San Francisco, CA, USA", "unit": "celsius"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "get_temperature_date", "arguments": {"location": "San Francisco, CA, USA", '
        '"date": "2024-10-01", "unit": "celsius"}}\n</tool_call>',
        "",
        [WEATHER_SF, WEATHER_DATE],
    ),
    (
        "hermes",
        "I'll look up the temperature for you.\n\n<tool_call>\n"
        '{"name": "get_current_temperature", "arguments": {"location": "San Francisco, CA, USA", '
        '"unit": "celsius"}}\n</tool_call>',
        "I'll look up the temperature for you.",
        [WEATHER_SF],
    ),
    (
        "hermes",  # keys in the other order, no closing tag (the model stopped at EOS)
        '<tool_call>\n{"arguments": {"location": "San Francisco, CA, USA", "unit": "celsius"}, '
        '"name": "get_current_temperature"}\n',
        "",
        [WEATHER_SF],
    ),
    ("hermes", "The answer is 42 <not a tool_call>.", "The answer is 42 <not a tool_call>.", []),
    (
        "hermes",  # a block that is not JSON stays text
        "<tool_call>\nget_current_temperature(SF)\n</tool_call>",
        "<tool_call>\nget_current_temperature(SF)\n</tool_call>",
        [],
    ),
    (
        "llama3_json",
        '{"name": "get_current_temperature", "parameters": {"location": "San Francisco, CA, USA", '
        '"unit": "celsius"}}',
        "",
        [WEATHER_SF],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "get_current_temperature", "parameters": {"location": '
        '"San Francisco, CA, USA", "unit": "celsius"}}; {"name": "get_temperature_date", '
        '"parameters": {"location": "San Francisco, CA, USA", "date": "2024-10-01", '
        '"unit": "celsius"}}',
        "",
        [WEATHER_SF, WEATHER_DATE],
    ),
    (
        "llama3_json",
        "It is sunny in {city}, as far as I know.",
        "It is sunny in {city}, as far as I know.",
        [],
    ),
    (
        "mistral",
        '[TOOL_CALLS] [{"name": "get_current_temperature", "arguments": {"location": '
        '"San Francisco, CA, USA", "unit": "celsius"}}, {"name": "get_temperature_date", '
        '"arguments": {"location": "San Francisco, CA, USA", "date": "2024-10-01", '
        '"unit": "celsius"}}]',
        "",
        [WEATHER_SF, WEATHER_DATE],
    ),
    (
        "mistral",
        '[TOOL_CALLS]get_current_temperature[ARGS]{"location": "San Francisco, CA, USA", '
        '"unit": "celsius"}[TOOL_CALLS]get_temperature_date[ARGS]{"location": '
        '"San Francisco, CA, USA", "date": "2024-10-01", "unit": "celsius"}',
        "",
        [WEATHER_SF, WEATHER_DATE],
    ),
    (
        "mistral",  # arguments quoted as a JSON string, as some fine-tunes write them
        '[TOOL_CALLS][{"name": "get_current_temperature", "arguments": "{\\"location\\": '
        '\\"San Francisco, CA, USA\\", \\"unit\\": \\"celsius\\"}"}]',
        "",
        [WEATHER_SF],
    ),
    ("mistral", "No tools needed [TOOLS] here.", "No tools needed [TOOLS] here.", []),
    (
        "pythonic",
        "[get_current_temperature(location='San Francisco, CA, USA', unit='celsius'), "
        'get_temperature_date(location="San Francisco, CA, USA", date="2024-10-01", '
        "unit='celsius')]",
        "",
        [WEATHER_SF, WEATHER_DATE],
    ),
    (
        "pythonic",
        "<|python_start|>[get_current_temperature(location='San Francisco, CA, USA', "
        "unit='celsius')]<|python_end|>",
        "",
        [WEATHER_SF],
    ),
    ("pythonic", "Sure: [1, 2, 3] are numbers.", "Sure: [1, 2, 3] are numbers.", []),
    ("pythonic", "[if(x=1)]", "[if(x=1)]", []),  # a keyword cannot name a call: content
]


def stream(parser: CallParser, pieces: list[str]) -> ParsedDelta:
    """Feed pieces one by one, checking every delta's shape on the way."""
    total = ParsedDelta()
    for piece in pieces:
        total.add(parser.feed(piece))
    total.add(parser.finish())
    named: set[int] = set()
    for delta in total.calls:
        if delta.name is not None:
            assert delta.index not in named, "a call is announced once"
            assert delta.index == len(named), "calls are announced in index order"
            assert not delta.arguments, "the first delta carries the name only"
            named.add(delta.index)
        else:
            assert delta.index in named, "arguments follow their call's name"
            assert delta.arguments
    return total


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@pytest.mark.parametrize(("parser", "output", "content", "calls"), RECORDED)
def test_recorded_outputs_parse_whole(parser, output, content, calls):
    assert TOOL_PARSERS[parser]().parse(output) == (content, calls)


@pytest.mark.parametrize(("parser", "output", "content", "calls"), RECORDED)
@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=40))
def test_recorded_outputs_streamed_in_random_splits_give_the_same_calls(
    parser, output, content, calls, cuts
):
    total = stream(TOOL_PARSERS[parser](), split(output, cuts))
    assert (total.content, collect_calls(total.calls)) == (content, calls)


def test_streaming_character_by_character_sends_arguments_before_the_call_closes():
    output = RECORDED[0][1]
    parser = TOOL_PARSERS["hermes"]()
    seen_fragments_before_close = 0
    for i, ch in enumerate(output):
        delta = parser.feed(ch)
        if any(d.arguments for d in delta.calls) and i < output.index("}}"):
            seen_fragments_before_close += 1
    assert seen_fragments_before_close > 10


def test_marker_prefixes_are_held_back_not_sent_as_content():
    parser = TOOL_PARSERS["hermes"]()
    assert parser.feed("Checking <tool_").content == "Checking"
    delta = parser.feed('call>{"name": "f", "arguments": {}}</tool_call>')
    assert delta.content == ""
    assert collect_calls(delta.calls) == [ToolCall("f", "{}")]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
# not Python keywords: the pythonic format cannot write `if()` or `f(class=1)` (its docstring)
identifiers = st.from_regex(r"[a-z_][a-z0-9_]{0,11}", fullmatch=True).filter(
    lambda name: not keyword.iskeyword(name)
)
calls_strategy = st.lists(
    st.builds(
        lambda name, args: ToolCall(name, json.dumps(args)),
        identifiers,
        st.dictionaries(identifiers, json_values, max_size=3),
    ),
    min_size=1,
    max_size=3,
)


@pytest.mark.parametrize("parser", sorted(TOOL_PARSERS))
@settings(max_examples=40, deadline=None)
@given(calls=calls_strategy, cuts=st.lists(st.integers(0, 10_000), max_size=20))
def test_each_family_reads_back_the_calls_it_writes(parser, calls, cuts):
    """`format_calls` renders history turns for the built-in template; parsing it back, in
    any split, gives the same calls."""
    text = TOOL_PARSERS[parser].format_calls(calls)
    total = stream(TOOL_PARSERS[parser](), split(text, cuts))
    parsed = collect_calls(total.calls)
    assert total.content == ""
    assert [c.name for c in parsed] == [c.name for c in calls]
    assert [json.loads(c.arguments) for c in parsed] == [json.loads(c.arguments) for c in calls]


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(0, 10_000), max_size=30))
def test_forced_required_output_is_an_array_of_calls(cuts):
    output = (
        '[{"name": "get_current_temperature", "parameters": {"location": "San Francisco, CA, '
        'USA", "unit": "celsius"}}, {"name": "get_time", "parameters": {}}]'
    )
    total = stream(JsonCallArray(), split(output, cuts))
    assert collect_calls(total.calls) == [WEATHER_SF, ToolCall("get_time", "{}")]


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(0, 10_000), max_size=30))
def test_forced_named_output_is_the_arguments(cuts):
    output = ' {"location": "San Francisco, CA, USA", "unit": "celsius"}\n'
    total = stream(NamedCallParser("get_current_temperature"), split(output, cuts))
    assert (total.content, collect_calls(total.calls)) == ("", [WEATHER_SF])


def test_forced_named_call_with_no_output_has_empty_arguments():
    assert NamedCallParser("f").parse("") == ("", [ToolCall("f", "{}")])


@pytest.mark.parametrize(
    ("template", "tokens", "expected"),
    [
        ("{% for m in messages %}<tool_call>{% endfor %}", [], "hermes"),
        ("{{ '<|python_tag|>' }}", [], "llama3_json"),
        ("{{ m }}", ["[TOOL_CALLS]", "[ARGS]"], "mistral"),
        ("{{ '<|python_start|>' }}", [], "pythonic"),
        ("{{ messages }}", [], "hermes"),
        (None, [], "hermes"),
    ],
)
def test_default_parser_follows_the_model_family(template, tokens, expected):
    assert default_tool_parser(template, tokens) == expected
