"""Structured outputs, forced tool calls and full tool round trips on the real server (the
bundled SmolLM2 behind API keys, shared with test_server_api.py), with the official client.

Needs the structured-output engine (enabled in tests/integration/conftest.py once it is
merged). `required` and named tool choices are real end to end: the grammar makes the model
call. Under `auto` a 135M model rarely calls a tool on its own, so a `regex` makes it write
Hermes calls, which the family parser then reads like any model's output.
"""

from __future__ import annotations

import asyncio
import enum
import json
import re
from typing import Literal

import aiohttp
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Rome", "Tokyo"]},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the local time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["CET", "JST", "UTC"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
RESULTS = {"get_weather": '{"temp": 18, "sky": "sunny"}', "get_time": '{"time": "14:05"}'}
# Two Hermes calls, as a family model writes them under tool_choice auto.
HERMES_CALL = (
    r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)", '
    r'"unit": "celsius"\}\}\n</tool_call>'
)
TWO_HERMES_CALLS = HERMES_CALL + r"\n" + HERMES_CALL


def chat(client, stream: bool, **request):
    """One turn, through the stream helper when streaming (it rebuilds the calls)."""
    request = {"model": MODEL, "temperature": 0, "max_tokens": 120, **request}
    if not stream:
        return client.chat.completions.create(**request)
    with client.chat.completions.stream(**request) as events:
        for _ in events:  # (get_final_completion refuses answers cut at max_tokens)
            pass
        return events.current_completion_snapshot


def check_arguments(call) -> dict:
    """The arguments are JSON that validates against the function's parameters."""
    arguments = json.loads(call.function.arguments)
    schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]["function"]
    jsonschema.validate(arguments, schema["parameters"])
    return arguments


def finish_the_round_trip(client, stream: bool, messages: list, message):
    """Send the tool results back and check the model answers (tool_choice none: a 135M model
    may well imitate its last turn and call again, which is not what is tested here)."""
    history = [
        *messages,
        message.model_dump(exclude_none=True),
        *[
            {"role": "tool", "tool_call_id": call.id, "content": RESULTS[call.function.name]}
            for call in message.tool_calls
        ],
    ]
    final = chat(client, stream, messages=history, tools=[WEATHER, TIME], tool_choice="none")
    final = final.choices[0]
    assert final.finish_reason in ("stop", "length")
    assert final.message.content


# ------------------------------------------------------------------ tool round trips


@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_choice_round_trip(api_client, stream):
    # One call (parallel calls are shown under auto below): an unbounded array gives a 135M
    # model room to keep adding calls until max_tokens.
    reply = chat(
        api_client,
        stream,
        messages=QUESTION,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    check_arguments(call)
    assert call.id.startswith("call_") and call.type == "function"
    finish_the_round_trip(api_client, stream, QUESTION, choice.message)


@pytest.mark.parametrize("stream", [False, True])
def test_named_tool_choice_round_trip(api_client, stream):
    named = {"type": "function", "function": {"name": "get_time"}}
    reply = chat(api_client, stream, messages=QUESTION, tools=[WEATHER, TIME], tool_choice=named)
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    assert check_arguments(call)["zone"] in ("CET", "JST", "UTC")
    finish_the_round_trip(api_client, stream, QUESTION, reply.choices[0].message)


@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_choice_round_trip_with_two_parallel_calls(api_client, stream):
    reply = chat(
        api_client,
        stream,
        messages=QUESTION,
        tools=[WEATHER, TIME],
        tool_choice="auto",
        extra_body={"regex": TWO_HERMES_CALLS},
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_weather"]
    assert all(check_arguments(c)["unit"] == "celsius" for c in calls)
    assert len({c.id for c in calls}) == 2
    finish_the_round_trip(api_client, stream, QUESTION, choice.message)


def test_streamed_and_whole_forced_calls_agree(api_client):
    request = {"messages": QUESTION, "tools": [WEATHER, TIME], "tool_choice": "required"}
    whole = chat(api_client, False, **request).choices[0].message.tool_calls
    streamed = chat(api_client, True, **request).choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in streamed] == [
        (c.function.name, c.function.arguments) for c in whole
    ]


# ------------------------------------------------------------------ response_format


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)


class Address(BaseModel):
    street: str = Field(max_length=30)
    city: str = Field(max_length=20)


class PersonWithAddress(BaseModel):
    person: Person
    address: Address


class Tags(BaseModel):
    tags: list[str] = Field(min_length=1, max_length=3)


class Paint(BaseModel):
    color: Color
    finish: Literal["matte", "gloss"]


class Book(BaseModel):
    title: str = Field(max_length=30)
    subtitle: str | None
    pages: int | None = Field(ge=1, le=2000)


class Reading(BaseModel):
    celsius: float = Field(ge=-50, le=60)
    humidity: int = Field(ge=0, le=100)


class Item(BaseModel):
    name: str = Field(max_length=15)
    quantity: int = Field(ge=1, le=10)


class Order(BaseModel):
    items: list[Item] = Field(min_length=1, max_length=3)
    express: bool


class Shape(BaseModel):
    kind: Literal["circle", "square", "triangle"]
    size: float = Field(gt=0, le=100)


class Company(BaseModel):
    name: str = Field(max_length=20)
    ceo: Person
    offices: list[Address] = Field(max_length=2)


class Flags(BaseModel):
    enabled: bool
    beta: bool
    level: Literal[1, 2, 3]


SCHEMAS = [PersonWithAddress, Person, Tags, Paint, Book, Reading, Order, Shape, Company, Flags]


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.__name__)
def test_parse_into_a_pydantic_model(api_client, schema):
    reply = api_client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": f"Give me an example {schema.__name__} as JSON."}],
        response_format=schema,
        temperature=0,
        max_tokens=300,
    )
    parsed = reply.choices[0].message.parsed
    assert isinstance(parsed, schema)
    schema.model_validate_json(reply.choices[0].message.content)  # bounds included


def test_json_object(api_client):
    reply = api_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a cat as a JSON object."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=200,
    )
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


@pytest.fixture(scope="module")
def native(api_server, api_keys):
    """POST /generate: (status, reply)."""

    def post(body: dict) -> tuple[int, dict]:
        return asyncio.run(_native(api_server, api_keys[0], body))

    return post


async def _native(server, key: str, body: dict) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.base_url + "/generate", json=body, headers=headers) as reply,
    ):
        return reply.status, await reply.json()


def test_regex_through_generate_full_matches(native):
    pattern = r"(yes|no), because [a-z ]{5,20}\."
    status, reply = native(
        {
            "text": "Is the sky blue? Answer:",
            "sampling_params": {"regex": pattern, "max_new_tokens": 64, "temperature": 0},
        },
    )
    assert status == 200
    assert re.fullmatch(pattern, reply["text"]), reply["text"]


def test_json_schema_through_generate(native):
    schema = Person.model_json_schema()
    status, reply = native(
        {
            "text": "A person as JSON:",
            "sampling_params": {"json_schema": json.dumps(schema), "max_new_tokens": 80},
        },
    )
    assert status == 200
    Person.model_validate_json(reply["text"])


def test_reasoning_is_split_from_the_answer(api_client):
    reply = api_client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        temperature=0,
        max_tokens=80,
        extra_body={"regex": r"<think>\n[A-Za-z ]{10,40}\n</think>\n\nIt is (sunny|rainy)\."},
    )
    message = reply.choices[0].message
    assert 10 <= len(message.reasoning_content.strip()) <= 40
    assert message.content in ("It is sunny.", "It is rainy.")


def test_logit_bias_bans_the_greedy_token(native, api_client):
    prompt = "The capital of France is"
    greedy = {"max_new_tokens": 1, "temperature": 0}
    status, reply = native({"text": prompt, "sampling_params": greedy})
    assert status == 200
    (banned,) = reply["output_ids"]
    status, biased = native(
        {"text": prompt, "sampling_params": {**greedy, "logit_bias": {banned: -100.0}}},
    )
    assert status == 200 and biased["output_ids"][0] != banned
    request = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    free = api_client.completions.create(**request).choices[0].text
    held_back = api_client.completions.create(**request, logit_bias={str(banned): -100})
    assert held_back.choices[0].text != free


# ------------------------------------------------------------------ bad constraints


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"regex": "(unclosed"}, "regex"),
        ({"ebnf": "root ::= ("}, "ebnf"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objekt"}},
                }
            },
            "response_format.json_schema.schema",
        ),
    ],
)
def test_bad_constraints_are_400s_and_the_server_keeps_serving(api_client, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        api_client.chat.completions.create(
            model=MODEL, messages=QUESTION, max_tokens=2, extra_body=extra
        )
    assert info.value.body["param"] == param
    reply = api_client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)
    assert reply.usage.completion_tokens >= 1
