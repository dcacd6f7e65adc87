"""`/v1/responses` driven by the official `openai` client, unmodified, over a scripted model
(see scripted_server.py): text, streamed events in the order the client's stream helpers
accept, a function-call round trip, reasoning, structured output parsed into a pydantic model,
previous_response_id with GET and DELETE, the directory store, and refusals naming the field."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pydantic
import pytest
from scripted_server import MODEL, serve

from radixserve.frontend.openai_responses.store import DirectoryStore, MemoryStore

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": True,
}
CHAT_WEATHER = {
    "type": "function",
    "function": {k: v for k, v in WEATHER.items() if k != "type"},
}
TWO_CALLS = (
    "Let me check both cities.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
)
FINAL_ANSWER = "Paris has 18C and sun; Rome has 21C and clouds."
QUESTION = "What is the weather in Paris and Rome?"

TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def collapsed(kinds: list[str]) -> list[str]:
    """Event types with runs of the same delta event shown once."""
    out: list[str] = []
    for kind in kinds:
        if not (out and out[-1] == kind and kind.endswith(".delta")):
            out.append(kind)
    return out


def test_create_answers_text_with_the_response_shape(smollm2_tokenizer):
    async def test(client, session, tm):
        response = await client.responses.create(
            model=MODEL,
            input="Say hello.",
            instructions="You are terse.",
            metadata={"run": "7"},
            temperature=0,
            user="someone",
        )
        assert response.output_text == "Hello there, friend!"
        assert response.object == "response" and response.status == "completed"
        assert response.id.startswith("resp_") and response.incomplete_details is None
        (message,) = response.output
        assert message.type == "message" and message.role == "assistant"
        assert message.id.startswith("msg_") and message.status == "completed"
        assert message.content[0].type == "output_text" and message.content[0].annotations == []
        assert response.metadata == {"run": "7"} and response.instructions == "You are terse."
        assert response.temperature == 0 and response.tool_choice == "auto"
        assert response.parallel_tool_calls is True and response.store is True
        assert response.text.format.type == "text"
        usage = response.usage
        assert usage.input_tokens == len(tm.seen[0].input_ids) and usage.output_tokens > 0
        assert usage.total_tokens == usage.input_tokens + usage.output_tokens
        assert usage.input_tokens_details.cached_tokens == 0
        assert usage.output_tokens_details.reasoning_tokens == 0

    tm = serve(smollm2_tokenizer, ["Hello there, friend!"], test)
    prompt = tm.prompt_text(0)
    # instructions are the system message, before the user's input
    assert prompt.index("You are terse.") < prompt.index("Say hello.")
    assert tm.seen[0].sampling_params.temperature == 0


def test_stream_sends_the_events_in_order_with_sequence_numbers(smollm2_tokenizer):
    async def test(client, session, tm):
        async with client.responses.stream(model=MODEL, input="Say hello.") as stream:
            events = [event async for event in stream]
            final = await stream.get_final_response()
        assert collapsed([e.type for e in events]) == TEXT_EVENTS
        assert [e.sequence_number for e in events] == list(range(len(events)))
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        assert len(deltas) > 1 and "".join(deltas) == "Hello there, friend!"
        created = events[0].response
        assert created.status == "in_progress" and created.output == []
        assert final.id == created.id and final.output_text == "Hello there, friend!"
        assert final.status == "completed" and final.usage.output_tokens > 0
        # raw SSE: typed `event:` lines, and no [DONE]
        async with session.post(
            "/v1/responses", json={"model": MODEL, "input": "again", "stream": True}
        ) as raw:
            text = await raw.text()
        assert text.startswith("event: response.created\ndata: {")
        assert "[DONE]" not in text and text.rstrip().split("\n")[-2] == "event: response.completed"

    serve(smollm2_tokenizer, ["Hello there, friend!", "Hi"], test)


@pytest.mark.parametrize("stream", [False, True])
def test_function_call_round_trip_renders_as_the_chat_path_does(smollm2_tokenizer, stream):
    async def test(client, session, tm):
        request = {"model": MODEL, "input": QUESTION, "tools": [WEATHER], "store": False}
        if stream:
            async with client.responses.stream(**request) as events:
                seen = [e async for e in events]
                first = await events.get_final_response()
            kinds = collapsed([e.type for e in seen])
            call_events = [
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
            assert kinds == TEXT_EVENTS[:-1] + call_events * 2 + ["response.completed"]
            done = [e for e in seen if e.type == "response.function_call_arguments.done"]
            assert [json.loads(e.arguments) for e in done] == [{"city": "Paris"}, {"city": "Rome"}]
        else:
            first = await client.responses.create(**request)
        message, *calls = first.output
        assert message.type == "message" and first.output_text == "Let me check both cities."
        assert [c.type for c in calls] == ["function_call", "function_call"]
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [
            ("get_weather", {"city": "Paris"}),
            ("get_weather", {"city": "Rome"}),
        ]
        assert all(c.call_id.startswith("call_") and c.id.startswith("fc_") for c in calls)
        assert first.tools[0].name == "get_weather"

        results = ["18C, sunny", "21C, cloudy"]
        history: list[Any] = [
            {"role": "user", "content": QUESTION},
            *[item.model_dump(exclude_none=True) for item in first.output],
            *[
                {"type": "function_call_output", "call_id": c.call_id, "output": r}
                for c, r in zip(calls, results, strict=True)
            ],
        ]
        final = await client.responses.create(
            model=MODEL, input=history, tools=[WEATHER], store=False
        )
        assert final.output_text == FINAL_ANSWER and len(final.output) == 1

        # the same conversation through /v1/chat/completions renders the same prompt
        chat_history = [
            {"role": "user", "content": QUESTION},
            {
                "role": "assistant",
                "content": "Let me check both cities.",
                "tool_calls": [
                    {
                        "id": c.call_id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in calls
                ],
            },
            *[
                {"role": "tool", "tool_call_id": c.call_id, "content": r}
                for c, r in zip(calls, results, strict=True)
            ],
        ]
        await client.chat.completions.create(
            model=MODEL, messages=chat_history, tools=[CHAT_WEATHER]
        )

    tm = serve(smollm2_tokenizer, [TWO_CALLS, FINAL_ANSWER, FINAL_ANSWER], test)
    # the built-in template describes the tool as the chat path does
    assert '{"name": "get_weather", "description": "Current weather in a city"' in tm.prompt_text(0)
    second = tm.prompt_text(1)
    assert '{"name": "get_weather", "arguments": {"city": "Rome"}}' in second
    assert "<tool_response>\n18C, sunny\n</tool_response>" in second
    assert second == tm.prompt_text(2)


def test_tool_choice_required_and_named_force_calls(smollm2_tokenizer):
    async def test(client, session, tm):
        named = await client.responses.create(
            model=MODEL,
            input=QUESTION,
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "get_weather"},
        )
        (call,) = named.output
        assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}
        assert named.tool_choice.type == "function" and named.tool_choice.name == "get_weather"
        required = await client.responses.create(
            model=MODEL, input=QUESTION, tools=[WEATHER], tool_choice="required"
        )
        assert [c.name for c in required.output] == ["get_weather"]
        none = await client.responses.create(
            model=MODEL, input=QUESTION, tools=[WEATHER], tool_choice="none"
        )
        assert none.output_text == "No tools."

    script = ['{"city": "Paris"}', '[{"name": "get_weather", "parameters": {"city": "Rome"}}]']
    tm = serve(smollm2_tokenizer, [*script, "No tools."], test)
    params = WEATHER["parameters"]
    assert json.loads(tm.seen[0].sampling_params.json_schema) == params
    assert json.loads(tm.seen[1].sampling_params.json_schema)["type"] == "array"
    assert "get_weather" not in tm.prompt_text(2)


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_is_an_output_item_with_a_summary(smollm2_tokenizer, stream):
    output = "<think>The user greets me.</think>Hello!"

    async def test(client, session, tm):
        request = {"model": MODEL, "input": "Hi", "reasoning": {"effort": "low"}}
        if stream:
            async with client.responses.stream(**request) as events:
                kinds = collapsed([e.type async for e in events])
                response = await events.get_final_response()
            assert kinds[2:7] == [
                "response.output_item.added",
                "response.reasoning_summary_part.added",
                "response.reasoning_summary_text.delta",
                "response.reasoning_summary_text.done",
                "response.reasoning_summary_part.done",
            ]
        else:
            response = await client.responses.create(**request)
        reasoning, message = response.output
        assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
        assert [s.text for s in reasoning.summary] == ["The user greets me."]
        assert response.output_text == "Hello!"
        assert response.usage.output_tokens_details.reasoning_tokens > 0
        assert response.reasoning.effort == "low"

    serve(smollm2_tokenizer, [output], test, reasoning_parser="qwen3")


class Weather(pydantic.BaseModel):
    city: str
    celsius: int


@pytest.mark.parametrize("stream", [False, True])
def test_text_format_json_schema_is_parsed_into_a_pydantic_model(smollm2_tokenizer, stream):
    async def test(client, session, tm):
        if stream:
            async with client.responses.stream(
                model=MODEL, input="Weather in Paris?", text_format=Weather
            ) as events:
                response = await events.get_final_response()
        else:
            response = await client.responses.parse(
                model=MODEL, input="Weather in Paris?", text_format=Weather
            )
        assert response.output_parsed == Weather(city="Paris", celsius=18)
        assert response.text.format.type == "json_schema"
        assert response.text.format.name == "Weather"

    tm = serve(smollm2_tokenizer, ['{"city": "Paris", "celsius": 18}'], test)
    schema = json.loads(tm.seen[0].sampling_params.json_schema)
    assert schema["properties"] == {
        "city": {"title": "City", "type": "string"},
        "celsius": {"title": "Celsius", "type": "integer"},
    }


def test_json_object_format_reaches_the_sampling_params(smollm2_tokenizer):
    async def test(client, session, tm):
        response = await client.responses.create(
            model=MODEL, input="JSON please", text={"format": {"type": "json_object"}}
        )
        assert json.loads(response.output_text) == {"a": 1}

    tm = serve(smollm2_tokenizer, ['{"a": 1}'], test)
    assert json.loads(tm.seen[0].sampling_params.json_schema) == {"type": "object"}


def test_previous_response_id_continues_and_get_and_delete_manage_it(smollm2_tokenizer):
    async def test(client, session, tm):
        first = await client.responses.create(
            model=MODEL, input="My name is Ann.", instructions="Remember names."
        )
        second = await client.responses.create(
            model=MODEL, input="What is my name?", previous_response_id=first.id
        )
        assert second.output_text == "Your name is Ann."
        assert second.previous_response_id == first.id
        third = await client.responses.create(
            model=MODEL, input="And again?", previous_response_id=second.id
        )
        fetched = await client.responses.retrieve(third.id)
        assert fetched.id == third.id and fetched.output_text == "Ann."
        assert fetched.model_dump() == third.model_dump()

        await client.responses.delete(third.id)
        with pytest.raises(openai.NotFoundError) as info:
            await client.responses.retrieve(third.id)
        assert third.id in info.value.message
        with pytest.raises(openai.NotFoundError) as info:
            await client.responses.delete(third.id)
        assert third.id in info.value.message
        with pytest.raises(openai.NotFoundError) as info:
            await client.responses.create(model=MODEL, input="hi", previous_response_id=third.id)
        assert info.value.body["param"] == "previous_response_id"
        # store: false keeps nothing
        unstored = await client.responses.create(model=MODEL, input="x", store=False)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(unstored.id)
        async with session.get("/v1/responses/resp_..%2F..%2Fetc") as reply:
            assert reply.status == 404

    tm = serve(smollm2_tokenizer, ["Nice to meet you.", "Your name is Ann.", "Ann.", "-"], test)
    second, third = tm.prompt_text(1), tm.prompt_text(2)
    # the earlier input and output come first; instructions are not carried over
    assert second.index("My name is Ann.") < second.index("Nice to meet you.")
    assert second.index("Nice to meet you.") < second.index("What is my name?")
    assert "Remember names." in tm.prompt_text(0) and "Remember names." not in second
    for earlier in ("My name is Ann.", "Your name is Ann.", "And again?"):
        assert earlier in third


def test_the_directory_store_survives_a_restart_and_stays_bounded(tmp_path):
    async def main():
        store = DirectoryStore(tmp_path, capacity=2)
        ids = [f"resp_{i:032x}" for i in range(3)]
        for i, response_id in enumerate(ids):
            await store.put(response_id, {"response": {"id": response_id, "n": i}})
            await asyncio.sleep(0.01)  # distinct modification times
        assert await store.get(ids[0]) is None  # the oldest went
        assert sorted(p.name for p in tmp_path.iterdir()) == [f"{i}.json" for i in ids[1:]]
        assert (await store.get(ids[1]))["response"]["n"] == 1  # now the most recently used
        await asyncio.sleep(0.01)
        reopened = DirectoryStore(tmp_path, capacity=2)  # the order comes from the files' times
        assert (await reopened.get(ids[2]))["response"]["n"] == 2  # ids[1] is now the oldest
        await reopened.put(f"resp_{9:032x}", {"response": {}})
        assert await reopened.get(ids[1]) is None and await reopened.get(ids[2]) is not None
        assert await reopened.delete(ids[2]) and not await reopened.delete(ids[2])
        assert await reopened.get("resp_../../x") is None

        memory = MemoryStore(capacity=1)
        await memory.put(ids[0], {})
        await memory.put(ids[1], {})
        assert await memory.get(ids[0]) is None and len(memory) == 1
        assert await MemoryStore(0).get(ids[0]) is None

    asyncio.run(main())


def test_responses_in_a_store_directory_are_served_by_the_next_server(smollm2_tokenizer, tmp_path):
    kept: dict[str, Any] = {}

    async def first(client, session, tm):
        kept["response"] = await client.responses.create(model=MODEL, input="Remember 42.")

    async def second(client, session, tm):
        fetched = await client.responses.retrieve(kept["response"].id)
        assert fetched.output_text == "42 noted."
        await client.responses.create(
            model=MODEL, input="Which number?", previous_response_id=fetched.id
        )

    serve(smollm2_tokenizer, ["42 noted."], first, responses_store_dir=str(tmp_path))
    tm = serve(smollm2_tokenizer, ["42."], second, responses_store_dir=str(tmp_path))
    assert "Remember 42." in tm.prompt_text(0) and "42 noted." in tm.prompt_text(0)


REFUSALS = [
    ({"background": True}, "background"),
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"tools": [WEATHER, {"type": "code_interpreter", "container": "auto"}]}, "tools.1.type"),
    ({"tools": [WEATHER], "tool_choice": {"type": "file_search"}}, "tool_choice"),
    ({"conversation": "conv_123"}, "conversation"),
    ({"include": ["file_search_call.results"]}, "include.0"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    (
        {
            "input": [
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "http://x/y.png"}],
                }
            ]
        },
        "input.0.content.0",
    ),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0.type"),
    ({"tools": [{**WEATHER, "parameters": {"type": "array"}}]}, "tools.0.parameters"),
    ({"tools": [{**WEATHER, "name": "bad name"}]}, "tools.0.name"),
    (
        {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 5}}}},
        "text.format.schema",
    ),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"previous_response_id": "resp_unknown"}, "previous_response_id"),
]


def test_refusals_are_400s_naming_the_field_and_the_server_keeps_serving(smollm2_tokenizer):
    async def test(client, session, tm):
        for fields, param in REFUSALS:
            request = {"model": MODEL, "input": QUESTION, **fields}
            async with session.post("/v1/responses", json=request) as reply:
                body = await reply.json()
            assert body["error"]["param"] == param, (fields, body)
            expected = 404 if param == "previous_response_id" else 400
            assert reply.status == expected, (fields, body)
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(model=MODEL, input="hi", background=True)
        assert "background" in info.value.message
        with pytest.raises(openai.NotFoundError):
            await client.responses.create(model="other-model", input="hi")
        reply = await client.responses.create(model=MODEL, input="hi")
        assert reply.output_text == "still here"

    serve(smollm2_tokenizer, ["still here"], test)


def test_output_text_logprobs_come_with_include(smollm2_tokenizer):
    async def test(client, session, tm):
        response = await client.responses.create(
            model=MODEL, input="hi", include=["message.output_text.logprobs"], top_logprobs=2
        )
        assert response.output[0].content[0].logprobs == []  # the scripted model has none

    tm = serve(smollm2_tokenizer, ["ok"], test)
    assert tm.seen[0].return_logprob and tm.seen[0].top_logprobs_num == 2


def test_a_failure_mid_stream_is_the_last_event_and_nothing_is_stored(
    smollm2_tokenizer, monkeypatch
):
    from scripted_server import ScriptedTokenizerManager

    from radixserve.frontend.tokenizer_manager import GenerationError

    scripted = ScriptedTokenizerManager.generate_many

    async def failing(self, requests, *args, **kwargs):
        async for index, chunk in scripted(self, requests, *args, **kwargs):
            yield index, chunk
            raise GenerationError("the model failed")

    monkeypatch.setattr(ScriptedTokenizerManager, "generate_many", failing)

    async def test(client, session, tm):
        async with client.responses.stream(model=MODEL, input="hi") as stream:
            events = [event async for event in stream]
        error = events[-1]
        assert error.type == "error" and "the model failed" in error.message
        assert [e.sequence_number for e in events] == list(range(len(events)))
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(events[0].response.id)
        with pytest.raises(openai.InternalServerError):
            await client.responses.create(model=MODEL, input="hi")

    serve(smollm2_tokenizer, ["Hello there!", "Hello there!"], test)


def test_strict_api_refuses_unknown_fields_of_items(smollm2_tokenizer):
    async def test(client, session, tm):
        body = {"model": MODEL, "input": [{"role": "user", "content": "hi", "shiny": 1}]}
        async with session.post("/v1/responses", json=body) as reply:
            error = (await reply.json())["error"]
        assert reply.status == 400 and error["param"] == "input.0.shiny"
        assert error["code"] == "unknown_field"

    serve(smollm2_tokenizer, [], test, strict_api=True)


def test_items_become_the_chat_messages_the_chat_path_renders():
    from radixserve.frontend.openai.protocol import FieldPolicy, parse_request
    from radixserve.frontend.openai_responses.protocol import ItemSource, ResponsesRequest

    call = {"type": "function_call", "name": "get_weather", "status": "completed"}
    body = {
        "model": MODEL,
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
            {"role": "user", "content": "Weather?"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "T"}]},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Checking."}],
            },
            {**call, "call_id": "call_a", "arguments": '{"city": "Paris"}'},
            {**call, "call_id": "call_b", "arguments": '{"city": "Rome"}'},
            {"type": "function_call_output", "call_id": "call_a", "output": "18C"},
            {
                "type": "function_call_output",
                "call_id": "call_b",
                "output": [{"type": "input_text", "text": "21C"}],
            },
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "U"}]},
            {**call, "call_id": "call_c", "arguments": "{}"},
        ],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
        "reasoning": {"effort": "high"},
        "max_output_tokens": 9,
    }
    req = parse_request(ResponsesRequest, body, FieldPolicy(strict=True))
    source = ItemSource()
    chat = req.chat_body([], source)

    def calls(*pairs):
        return [
            {"id": i, "type": "function", "function": {"name": "get_weather", "arguments": a}}
            for i, a in pairs
        ]

    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "T",
            "tool_calls": calls(("call_a", '{"city": "Paris"}'), ("call_b", '{"city": "Rome"}')),
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_b", "content": "21C"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": calls(("call_c", "{}")),
            "reasoning_content": "U",
        },
    ]
    assert chat["tools"] == [CHAT_WEATHER]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "w", "schema": {"type": "object"}},
    }
    assert chat["chat_template_kwargs"] == {"reasoning_effort": "high"}
    assert chat["max_completion_tokens"] == 9
    # chat params named as the request named them
    assert source.param("messages.0") == "instructions"
    assert source.param("messages.3.content") == "input.3"
    assert source.param("messages.6") == "input.9"
    assert source.param("tools.0.function.parameters") == "tools.0.parameters"
    assert source.param("response_format.json_schema.schema") == "text.format.schema"
    assert source.param("max_tokens") == "max_output_tokens"
