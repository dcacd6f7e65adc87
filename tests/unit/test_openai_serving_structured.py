"""Structured output and forced tool calls through the HTTP front end, over a scripted model
(see scripted_server.py): what the front door hands the engine (SamplingParams.json_schema,
regex, ebnf, logit_bias) and how forced output is read back, with the official client.

The grammar itself is exercised with a real model in
tests/integration/test_server_structured.py.
"""

from __future__ import annotations

import json

import openai
import pytest
from scripted_server import MODEL, serve

from radixserve.frontend.openai.tool_calls import forced_tool_schema

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
    },
}
QUESTION = [{"role": "user", "content": "Weather in Paris, and the time in CET?"}]


class Function:
    def __init__(self, tool: dict) -> None:
        self.name = tool["function"]["name"]
        self._parameters = tool["function"]["parameters"]

    def parameters_schema(self) -> dict:
        return self._parameters


async def create_or_stream(client, stream: bool, **request):
    if not stream:
        return await client.chat.completions.create(**request)
    async with client.chat.completions.stream(**request) as events:
        return await events.get_final_completion()


@pytest.mark.parametrize("stream", [False, True])
def test_required_forces_calls_through_a_schema_and_reads_them_as_json(smollm2_tokenizer, stream):
    output = (
        '[{"name": "get_weather", "parameters": {"city": "Paris"}}, '
        '{"name": "get_time", "parameters": {"zone": "CET"}}]'
    )

    async def test(client, session, tm):
        reply = await create_or_stream(
            client,
            stream,
            model=MODEL,
            messages=QUESTION,
            tools=[WEATHER, TIME],
            tool_choice="required",
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert [
            (c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls
        ] == [
            ("get_weather", {"city": "Paris"}),
            ("get_time", {"zone": "CET"}),
        ]

    tm = serve(smollm2_tokenizer, [output], test)
    expected = forced_tool_schema([Function(WEATHER), Function(TIME)], "required", parallel=True)
    assert json.loads(tm.seen[0].sampling_params.json_schema) == expected


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_choice_forces_that_functions_arguments(smollm2_tokenizer, stream):
    async def test(client, session, tm):
        reply = await create_or_stream(
            client,
            stream,
            model=MODEL,
            messages=QUESTION,
            tools=[WEATHER, TIME],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
        (call,) = reply.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == (
            "get_weather",
            {"city": "Paris"},
        )

    tm = serve(smollm2_tokenizer, ['{"city": "Paris"}'], test)
    assert json.loads(tm.seen[0].sampling_params.json_schema) == WEATHER["function"]["parameters"]


def test_response_formats_regex_ebnf_and_logit_bias_reach_the_sampling_params(smollm2_tokenizer):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

    async def test(client, session, tm):
        await client.chat.completions.create(
            model=MODEL, messages=QUESTION, response_format={"type": "json_object"}
        )
        await client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            response_format={"type": "json_schema", "json_schema": {"name": "N", "schema": schema}},
        )
        await client.chat.completions.create(
            model=MODEL, messages=QUESTION, extra_body={"regex": "[0-9]+"}
        )
        await client.completions.create(
            model=MODEL, prompt="x", extra_body={"ebnf": 'root ::= "yes" | "no"'}
        )
        await client.completions.create(model=MODEL, prompt="x", logit_bias={"42": -100})
        native = {"text": "x", "sampling_params": {"json_schema": json.dumps(schema)}}
        async with session.post("/generate", json=native) as reply:
            assert reply.status == 200

    tm = serve(smollm2_tokenizer, ['{"a": 1}', '{"n": 1}', "7", "yes", "ok", '{"n": 2}'], test)
    params = [request.sampling_params for request in tm.seen]
    assert json.loads(params[0].json_schema) == {"type": "object"}
    assert json.loads(params[1].json_schema) == schema
    assert params[2].regex == "[0-9]+"
    assert params[3].ebnf == 'root ::= "yes" | "no"'
    assert params[4].logit_bias == {42: -100.0}
    assert json.loads(params[5].json_schema) == schema


def test_a_bad_regex_is_a_400_before_anything_is_admitted(smollm2_tokenizer):
    async def test(client, session, tm):
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(
                model=MODEL, messages=QUESTION, extra_body={"regex": "(unclosed"}
            )
        assert info.value.body["param"] == "regex"
        assert not tm.seen

    serve(smollm2_tokenizer, [], test)
