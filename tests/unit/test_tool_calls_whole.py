"""Tool calls reach a client only whole: a call goes out once its parser is done with it, with
arguments that are JSON, and an output cut inside a call (`finish_reason: length`) drops that
call. A forced call's grammar is bounded: one call without parallel calls, at most
MAX_FORCED_CALLS with them. Parsers directly (every family, cut anywhere), then the three APIs
with their official clients over a scripted model (scripted_server.py)."""

from __future__ import annotations

import json

import anthropic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scripted_server import MODEL, Scripted, serve

from radixserve.frontend.openai.tool_calls import (
    MAX_FORCED_CALLS,
    ChoiceOutput,
    forced_tool_schema,
)
from radixserve.frontend.openai.tool_parsers import (
    TOOL_PARSERS,
    CallParser,
    CompleteCalls,
    JsonCallArray,
    NamedCallParser,
    ToolCall,
    collect_calls,
    whole_arguments,
)

CALLS = [
    ToolCall("get_weather", '{"city": "Paris", "days": [1, 2], "unit": {"name": "celsius"}}'),
    ToolCall("get_time", "{}"),
    ToolCall("get_weather", '{"city": "Rome, \\"IT\\"", "days": [3]}'),
]


def written(parser: str) -> str:
    """CALLS as the family's models write them; `required` is the forced array."""
    if parser == "required":
        array = [{"name": c.name, "parameters": json.loads(c.arguments)} for c in CALLS]
        return json.dumps(array)
    return TOOL_PARSERS[parser].format_calls(CALLS)


def new_parser(parser: str) -> CallParser:
    return JsonCallArray() if parser == "required" else TOOL_PARSERS[parser]()


def run(calls: CompleteCalls, pieces: list[str]) -> tuple[str, list[list[ToolCall]]]:
    """Content, and the calls each feed let out (the last piece is final)."""
    content, released = "", []
    for k, piece in enumerate(pieces):
        out = calls.feed(piece, final=k == len(pieces) - 1)
        content += out.content
        names = [d for d in out.calls if d.name is not None]
        assert [d.index for d in names] == list(range(calls.released - len(names), calls.released))
        released.append(collect_calls(out.calls))
    return content, released


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def same_call(a: ToolCall, b: ToolCall) -> bool:
    return a.name == b.name and json.loads(a.arguments) == json.loads(b.arguments)


# ------------------------------------------------------------------ the parsers, cut anywhere


@pytest.mark.parametrize("parser", [*sorted(TOOL_PARSERS), "required"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_an_output_cut_anywhere_gives_only_whole_calls(parser, data):
    """Cut at any character and streamed in any split, the calls let out are the calls that
    were complete, each in one feed with JSON arguments, and no piece of the cut call is
    content (a family's marker cut before it was whole, `<tool_ca`, was never a call: text)."""
    text = written(parser)
    end = data.draw(st.integers(0, len(text)), label="end")
    cuts = data.draw(st.lists(st.integers(0, 10_000), max_size=12), label="cuts")
    content, released = run(CompleteCalls(new_parser(parser)), split(text[:end], cuts) or [""])
    calls = [call for feed in released for call in feed]
    marker_prefix = content == text[:end] and not set(content) & set('{("')
    assert content == "" or (marker_prefix and not calls)
    assert all(whole_arguments(call.arguments) for call in calls)
    assert len(calls) <= len(CALLS)
    assert all(same_call(a, b) for a, b in zip(calls, CALLS, strict=False))
    if end == len(text):
        assert len(calls) == len(CALLS)


@pytest.mark.parametrize("parser", ["hermes", "llama3_json", "mistral", "required"])
def test_a_call_goes_out_in_the_feed_that_closes_it(parser):
    text = written(parser)
    calls = CompleteCalls(new_parser(parser))
    closes = []
    for i, ch in enumerate(text):
        if calls.feed(ch).calls:
            closes.append(i)
    assert len(closes) == len(CALLS)
    assert all(text[i] == "}" for i in closes), "the character that closes the call's object"


def test_a_named_call_cut_inside_its_arguments_is_dropped():
    assert NamedCallParser("get_weather").parse('{"city": "Par') == ("", [])
    assert NamedCallParser("get_weather").parse('{"city": "Paris"}') == (
        "",
        [ToolCall("get_weather", '{"city": "Paris"}')],
    )


def test_a_call_whose_arguments_are_not_json_is_dropped_and_the_next_renumbered():
    text = (
        '<tool_call>{"name": "f", "arguments": {"a": NaN}}</tool_call>'
        '<tool_call>{"name": "g", "arguments": {"b": tru}}</tool_call>'
        '<tool_call>{"name": "h", "arguments": {"c": 1}}</tool_call>'
    )
    out = CompleteCalls(TOOL_PARSERS["hermes"]()).feed(text, final=True)
    assert [(d.index, d.name) for d in out.calls if d.name] == [(0, "h")]


def test_an_unclosed_call_keeps_only_a_whole_object_of_arguments():
    """A model that stops (EOS) after the arguments but before the call's closing brace
    still called; a bare number might have been cut (12 of 123)."""
    assert TOOL_PARSERS["hermes"]().parse('<tool_call>{"name": "f", "arguments": {"a": 1}') == (
        "",
        [ToolCall("f", '{"a": 1}')],
    )
    assert TOOL_PARSERS["hermes"]().parse('<tool_call>{"name": "f", "arguments": 12') == ("", [])


def test_without_parallel_calls_only_the_first_complete_call_goes_out():
    output = ChoiceOutput(None, TOOL_PARSERS["hermes"](), parallel_tool_calls=False)
    _, _, deltas = output.feed(written("hermes"), final=True)
    assert collect_calls(deltas) == CALLS[:1]
    assert len(output.call_ids) == 1


# ------------------------------------------------------------------ the forced call's grammar


class Function:
    def __init__(self, name: str) -> None:
        self.name = name

    def parameters_schema(self) -> dict:
        return {"type": "object", "properties": {"city": {"type": "string"}}}


def test_forced_schemas_are_bounded():
    functions = [Function("get_weather"), Function("get_time")]
    required = forced_tool_schema(functions, "required", parallel=True)
    assert (required["minItems"], required["maxItems"]) == (1, MAX_FORCED_CALLS)
    assert MAX_FORCED_CALLS == 8  # docs/api.md names it
    single = forced_tool_schema(functions, "required", parallel=False)
    assert (single["minItems"], single["maxItems"]) == (1, 1)
    for parallel in (True, False):  # a named function: its arguments, one call by construction
        named = forced_tool_schema(functions, "get_time", parallel=parallel)
        assert named == functions[1].parameters_schema()


# ------------------------------------------------------------------ the APIs, over the scripted model

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS},
}
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
# a weak model under tool_choice required repeats its call until max_tokens
LOOPING = Scripted(f"[{CALL}, {CALL}, " + '{"name": "get_weather", "parameters": {"ci', "length")
# under auto, the second hermes call is cut inside its arguments
HERMES_CUT = Scripted(
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ro',
    "length",
)
NAMED_CUT = Scripted('{"city": "Pa', "length")
NAMED = {"type": "function", "function": {"name": "get_weather"}}
CASES = [  # (tool_choice, scripted output, how many whole calls it holds)
    ("required", LOOPING, 2),
    ("auto", HERMES_CUT, 1),
    (NAMED, NAMED_CUT, 0),
]


async def chat_calls(client, stream: bool, **request) -> tuple[list[tuple[str, str]], str]:
    """(name, arguments) of every call as a client rebuilds it, and the finish reason."""
    if not stream:
        reply = await client.chat.completions.create(**request)
        choice = reply.choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        return calls, choice.finish_reason
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    finish = None
    async for chunk in await client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or []:
                if d.function.name is not None:
                    names[d.index] = d.function.name
                arguments[d.index] = arguments.get(d.index, "") + (d.function.arguments or "")
    assert sorted(arguments) == sorted(names) == list(range(len(names)))
    return [(names[i], arguments[i]) for i in sorted(names)], finish


@pytest.mark.parametrize("stream", [False, True])
def test_chat_cut_inside_a_call_returns_the_whole_calls_and_length(smollm2_tokenizer, stream):
    async def test(client, session, tm):
        for tool_choice, _, whole in CASES:
            calls, finish = await chat_calls(
                client,
                stream,
                model=MODEL,
                messages=QUESTION,
                tools=[WEATHER],
                tool_choice=tool_choice,
                max_tokens=40,
            )
            assert finish == "length"
            assert [(name, json.loads(args)) for name, args in calls] == [
                ("get_weather", {"city": "Paris"})
            ] * whole

    serve(smollm2_tokenizer, [output for _, output, _ in CASES], test)


def test_chat_forced_schemas_follow_parallel_tool_calls(smollm2_tokenizer):
    async def test(client, session, tm):
        for choice, parallel in [("required", None), ("required", False), (NAMED, False)]:
            extra = {} if parallel is None else {"parallel_tool_calls": parallel}
            await client.chat.completions.create(
                model=MODEL, messages=QUESTION, tools=[WEATHER], tool_choice=choice, **extra
            )

    tm = serve(smollm2_tokenizer, [f"[{CALL}]", f"[{CALL}]", '{"city": "Paris"}'], test)
    schemas = [json.loads(r.sampling_params.json_schema) for r in tm.seen]
    assert schemas[0]["maxItems"] == MAX_FORCED_CALLS
    assert schemas[1]["maxItems"] == 1
    assert schemas[2] == WEATHER_PARAMETERS


ANTHROPIC_WEATHER = {"name": "get_weather", "input_schema": WEATHER_PARAMETERS}
ANTHROPIC_CHOICES = [{"type": "any"}, {"type": "auto"}, {"type": "tool", "name": "get_weather"}]


def claude(client) -> anthropic.AsyncAnthropic:
    root = str(client.base_url).rstrip("/").removesuffix("/v1")
    return anthropic.AsyncAnthropic(base_url=root, api_key="unused", max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
def test_messages_cut_inside_a_call_return_whole_tool_use_blocks(smollm2_tokenizer, stream):
    async def test(client, session, tm):
        async with claude(client) as c:
            for choice, (_, _, whole) in zip(ANTHROPIC_CHOICES, CASES, strict=True):
                request = {
                    "model": MODEL,
                    "max_tokens": 40,
                    "messages": QUESTION,
                    "tools": [ANTHROPIC_WEATHER],
                    "tool_choice": choice,
                }
                if not stream:
                    message = await c.messages.create(**request)
                else:
                    partial: dict[int, str] = {}
                    async with c.messages.stream(**request) as events:
                        async for event in events:
                            if event.type == "content_block_delta" and (
                                event.delta.type == "input_json_delta"
                            ):
                                joined = partial.get(event.index, "") + event.delta.partial_json
                                partial[event.index] = joined
                        message = await events.get_final_message()
                    assert len(partial) == whole
                    assert all(json.loads(text) == {"city": "Paris"} for text in partial.values())
                assert message.stop_reason == "max_tokens"
                uses = [b for b in message.content if b.type == "tool_use"]
                assert [(b.name, b.input) for b in uses] == [
                    ("get_weather", {"city": "Paris"})
                ] * whole

    serve(smollm2_tokenizer, [output for _, output, _ in CASES], test)


def test_messages_without_parallel_tool_use_force_one_call(smollm2_tokenizer):
    async def test(client, session, tm):
        async with claude(client) as c:
            await c.messages.create(
                model=MODEL,
                max_tokens=40,
                messages=QUESTION,
                tools=[ANTHROPIC_WEATHER],
                tool_choice={"type": "any", "disable_parallel_tool_use": True},
            )
            await c.messages.create(
                model=MODEL,
                max_tokens=40,
                messages=QUESTION,
                tools=[ANTHROPIC_WEATHER],
                tool_choice={"type": "any"},
            )

    tm = serve(smollm2_tokenizer, [f"[{CALL}]", f"[{CALL}]"], test)
    schemas = [json.loads(r.sampling_params.json_schema) for r in tm.seen]
    assert [s["maxItems"] for s in schemas] == [1, MAX_FORCED_CALLS]


RESPONSES_WEATHER = {"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMETERS}
RESPONSES_CHOICES = ["required", "auto", {"type": "function", "name": "get_weather"}]


@pytest.mark.parametrize("stream", [False, True])
def test_responses_cut_inside_a_call_are_incomplete_with_whole_calls(smollm2_tokenizer, stream):
    async def test(client, session, tm):
        for choice, (_, _, whole) in zip(RESPONSES_CHOICES, CASES, strict=True):
            request = {
                "model": MODEL,
                "input": "Weather in Paris?",
                "tools": [RESPONSES_WEATHER],
                "tool_choice": choice,
                "max_output_tokens": 40,
                "store": False,
            }
            if not stream:
                response = await client.responses.create(**request)
            else:
                deltas: dict[str, str] = {}
                response = None
                async for event in await client.responses.create(**request, stream=True):
                    if event.type == "response.function_call_arguments.delta":
                        deltas[event.item_id] = deltas.get(event.item_id, "") + event.delta
                    if event.type in ("response.completed", "response.incomplete"):
                        response = event.response
                assert response is not None
                assert len(deltas) == whole
                assert all(json.loads(text) == {"city": "Paris"} for text in deltas.values())
            assert response.status == "incomplete"
            assert response.incomplete_details.reason == "max_output_tokens"
            calls = [item for item in response.output if item.type == "function_call"]
            assert [(c.name, json.loads(c.arguments)) for c in calls] == [
                ("get_weather", {"city": "Paris"})
            ] * whole

    serve(smollm2_tokenizer, [output for _, output, _ in CASES], test)


def test_responses_without_parallel_tool_calls_force_one_call(smollm2_tokenizer):
    async def test(client, session, tm):
        for parallel in (False, True):
            await client.responses.create(
                model=MODEL,
                input="Weather in Paris?",
                tools=[RESPONSES_WEATHER],
                tool_choice="required",
                parallel_tool_calls=parallel,
                store=False,
            )

    tm = serve(smollm2_tokenizer, [f"[{CALL}]", f"[{CALL}]"], test)
    schemas = [json.loads(r.sampling_params.json_schema) for r in tm.seen]
    assert [s["maxItems"] for s in schemas] == [1, MAX_FORCED_CALLS]
