"""Anthropic's Messages API with the official `anthropic` client over a scripted model (see
scripted_server.py): text, streams, a tool_use -> tool_result round trip rendered as the OpenAI
chat path renders it, forced tools, thinking, count_tokens, and errors in Anthropic's shape."""

from __future__ import annotations

import json

import anthropic
import pytest
from scripted_server import MODEL, serve

WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
OPENAI_WEATHER = {
    "type": "function",
    "function": {
        "name": WEATHER["name"],
        "description": WEATHER["description"],
        "parameters": WEATHER["input_schema"],
    },
}
TWO_CALLS = (
    "Let me check both cities.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
)
FINAL_ANSWER = "Paris has 18C and sun; Rome has 21C and clouds."
QUESTION = [{"role": "user", "content": "What is the weather in Paris and Rome?"}]


def claude(client, api_key: str = "unused") -> anthropic.AsyncAnthropic:
    """The official client on the same server as the scripted `openai` client."""
    root = str(client.base_url).rstrip("/").removesuffix("/v1")
    return anthropic.AsyncAnthropic(base_url=root, api_key=api_key, max_retries=0)


def test_messages_create_returns_a_text_message(smollm2_tokenizer):
    async def test(client, session, tm):
        async with claude(client) as c:
            message = await c.messages.create(
                model=MODEL,
                max_tokens=40,
                system=[{"type": "text", "text": "You are terse."}],
                messages=[{"role": "user", "content": [{"type": "text", "text": "Hi!"}]}],
                stop_sequences=["\n\n"],
                metadata={"user_id": "u-1"},
                extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 5},
            )
        assert message.id.startswith("msg_") and message.type == "message"
        assert (message.role, message.model) == ("assistant", MODEL)
        assert [(b.type, b.text) for b in message.content] == [("text", "Hello there.")]
        assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
        assert message.usage.input_tokens == len(tm.seen[0].input_ids)
        assert message.usage.output_tokens == 4
        assert message.usage.cache_read_input_tokens == 0

    tm = serve(smollm2_tokenizer, ["Hello there."], test)
    params = tm.seen[0].sampling_params
    assert (params.max_new_tokens, params.temperature, params.top_p, params.top_k) == (
        40,
        0.5,
        0.9,
        5,
    )
    assert params.stop == ["\n\n"]
    prompt = tm.prompt_text(0)
    assert "You are terse." in prompt and "Hi!" in prompt


def test_messages_stream_sends_anthropic_events_in_order(smollm2_tokenizer):
    async def test(client, session, tm):
        async with (
            claude(client) as c,
            c.messages.stream(model=MODEL, max_tokens=16, messages=QUESTION) as stream,
        ):
            types = [event.type async for event in stream]
            message = await stream.get_final_message()
        assert message.content[0].text == FINAL_ANSWER
        assert message.stop_reason == "end_turn"
        assert message.usage.output_tokens > 0 and message.usage.input_tokens > 0
        raw = [t for t in types if t not in ("text",)]  # the client adds `text` events
        assert raw[:2] == ["message_start", "content_block_start"]
        assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
        assert set(raw[2:-3]) == {"content_block_delta"}

        body = {"model": MODEL, "max_tokens": 8, "messages": QUESTION, "stream": True}
        async with session.post("/v1/messages", json=body) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            text = await r.text()
        events = [e for e in text.split("\n\n") if e]
        for event in events:
            kind, data = event.split("\n")
            assert kind.startswith("event: ") and data.startswith("data: ")
            assert json.loads(data[len("data: ") :])["type"] == kind[len("event: ") :]
        assert "[DONE]" not in text

    serve(smollm2_tokenizer, [FINAL_ANSWER, "again"], test)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_then_tool_result_round_trip(smollm2_tokenizer, stream):
    async def test(client, session, tm):
        async with claude(client) as c:
            request = {"model": MODEL, "max_tokens": 100, "messages": QUESTION, "tools": [WEATHER]}
            if stream:
                async with c.messages.stream(**request) as events:
                    message = await events.get_final_message()
            else:
                message = await c.messages.create(**request)
            assert message.stop_reason == "tool_use"
            assert [b.type for b in message.content] == ["text", "tool_use", "tool_use"]
            assert message.content[0].text == "Let me check both cities."
            calls = message.content[1:]
            assert [(b.name, b.input) for b in calls] == [
                ("get_weather", {"city": "Paris"}),
                ("get_weather", {"city": "Rome"}),
            ]
            assert all(b.id.startswith("toolu_") for b in calls)
            assert len({b.id for b in calls}) == 2

            history = [
                *QUESTION,
                {"role": "assistant", "content": [b.model_dump() for b in message.content]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": b.id, "content": result}
                        for b, result in zip(calls, ["18C, sunny", "21C, cloudy"], strict=True)
                    ],
                },
            ]
            final = await c.messages.create(
                model=MODEL, max_tokens=100, messages=history, tools=[WEATHER]
            )
        assert final.content[0].text == FINAL_ANSWER and final.stop_reason == "end_turn"

        # the same conversation through the OpenAI chat path renders the same prompt
        openai_history = [
            *QUESTION,
            {
                "role": "assistant",
                "content": "Let me check both cities.",
                "tool_calls": [
                    {
                        "id": b.id,
                        "type": "function",
                        "function": {"name": b.name, "arguments": json.dumps(b.input)},
                    }
                    for b in calls
                ],
            },
            *[
                {"role": "tool", "tool_call_id": b.id, "content": result}
                for b, result in zip(calls, ["18C, sunny", "21C, cloudy"], strict=True)
            ],
        ]
        await client.chat.completions.create(
            model=MODEL, messages=openai_history, tools=[OPENAI_WEATHER]
        )

    tm = serve(smollm2_tokenizer, [TWO_CALLS, FINAL_ANSWER, "same"], test)
    first, second = tm.prompt_text(0), tm.prompt_text(1)
    assert json.dumps(OPENAI_WEATHER) in first  # the built-in template describes the tool
    assert "<tool_response>\n18C, sunny\n</tool_response>" in second
    assert '{"name": "get_weather", "arguments": {"city": "Rome"}}' in second
    assert second == tm.prompt_text(2)


@pytest.mark.parametrize(
    ("tool_choice", "output"),
    [
        ({"type": "any"}, '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'),
        ({"type": "tool", "name": "get_weather"}, '{"city": "Paris"}'),
    ],
)
def test_a_forced_tool_is_a_schema_constraint(smollm2_tokenizer, tool_choice, output):
    async def test(client, session, tm):
        async with claude(client) as c:
            message = await c.messages.create(
                model=MODEL,
                max_tokens=50,
                messages=QUESTION,
                tools=[WEATHER],
                tool_choice=tool_choice,
            )
        assert message.stop_reason == "tool_use"
        assert [(b.type, b.name, b.input) for b in message.content] == [
            ("tool_use", "get_weather", {"city": "Paris"})
        ]

    tm = serve(smollm2_tokenizer, [output], test)
    assert tm.seen[0].sampling_params.json_schema is not None


def test_tool_choice_none_leaves_the_tools_out(smollm2_tokenizer):
    async def test(client, session, tm):
        async with claude(client) as c:
            message = await c.messages.create(
                model=MODEL,
                max_tokens=50,
                messages=QUESTION,
                tools=[WEATHER],
                tool_choice={"type": "none"},
            )
        assert message.content[0].text == TWO_CALLS and message.stop_reason == "end_turn"

    tm = serve(smollm2_tokenizer, [TWO_CALLS], test)
    assert "get_weather" not in tm.prompt_text(0)


@pytest.mark.parametrize("stream", [False, True])
def test_thinking_comes_back_as_thinking_blocks(smollm2_tokenizer, stream):
    output = "<think>\nParis is in France.\n</think>\n\nIt is mild in Paris."

    async def test(client, session, tm):
        async with claude(client) as c:
            request = {
                "model": MODEL,
                "max_tokens": 100,
                "messages": QUESTION,
                "thinking": {"type": "enabled", "budget_tokens": 1024},
            }
            if stream:
                async with c.messages.stream(**request) as events:
                    kinds = [e.delta.type async for e in events if e.type == "content_block_delta"]
                    message = await events.get_final_message()
                assert {"thinking_delta", "text_delta"} <= set(kinds)
            else:
                message = await c.messages.create(**request)
        assert [b.type for b in message.content] == ["thinking", "text"]
        assert message.content[0].thinking == "\nParis is in France.\n"
        assert message.content[1].text == "It is mild in Paris."

    serve(smollm2_tokenizer, [output], test, reasoning_parser="qwen3")


def test_count_tokens_counts_the_rendered_prompt(smollm2_tokenizer):
    async def test(client, session, tm):
        async with claude(client) as c:
            request = {"model": MODEL, "system": "Be brief.", "messages": QUESTION}
            counted = await c.messages.count_tokens(**request, tools=[WEATHER])
            await c.messages.create(**request, tools=[WEATHER], max_tokens=10)
        assert counted.input_tokens == len(tm.seen[0].input_ids)

    serve(smollm2_tokenizer, ["ok"], test)


def test_errors_have_anthropic_shape_and_name_the_field(smollm2_tokenizer):
    async def test(client, session, tm):
        async with session.post("/v1/messages", json={"model": MODEL, "messages": QUESTION}) as r:
            body = await r.json()
        assert r.status == 400
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
        assert "max_tokens" in body["error"]["message"]
        async with claude(client) as c:
            with pytest.raises(anthropic.BadRequestError) as info:
                await c.messages.create(
                    model=MODEL, max_tokens=5, messages=[{"role": "system", "content": "x"}]
                )
            assert info.value.body["error"]["type"] == "invalid_request_error"
            assert "messages.0.role" in info.value.body["error"]["message"]
            with pytest.raises(anthropic.NotFoundError) as info:
                await c.messages.create(model="claude-nope", max_tokens=5, messages=QUESTION)
            assert info.value.body["error"]["type"] == "not_found_error"
            assert "claude-nope" in info.value.body["error"]["message"]
            with pytest.raises(anthropic.BadRequestError) as info:
                await c.messages.create(
                    model=MODEL,
                    max_tokens=5,
                    messages=QUESTION,
                    tools=[WEATHER],
                    tool_choice={"type": "tool", "name": "nope"},
                )
            assert "tool_choice.name" in info.value.body["error"]["message"]
            with pytest.raises(anthropic.BadRequestError) as info:
                await c.messages.count_tokens(model=MODEL, messages=[])
            assert "messages" in info.value.body["error"]["message"]
            message = await c.messages.create(model=MODEL, max_tokens=5, messages=QUESTION)
            assert message.content[0].text == "still here"
        async with session.get("/v1/messages") as r:
            body = await r.json()
        assert (r.status, body["error"]["type"]) == (405, "invalid_request_error")
        assert "POST" in body["error"]["message"]

    serve(smollm2_tokenizer, ["still here"], test)


def test_the_api_key_is_read_from_x_api_key(smollm2_tokenizer):
    async def test(client, session, tm):
        async with claude(client, api_key="sk-user") as c:
            message = await c.messages.create(model=MODEL, max_tokens=5, messages=QUESTION)
            assert message.content[0].text == "ok"
        async with claude(client, api_key="wrong") as c:
            with pytest.raises(anthropic.AuthenticationError) as info:
                await c.messages.create(model=MODEL, max_tokens=5, messages=QUESTION)
            assert info.value.body["error"]["type"] == "authentication_error"
        async with session.get("/v1/models", headers={"x-api-key": "sk-user"}) as r:
            assert r.status == 200
        async with session.get("/v1/models", headers={"x-api-key": "wrong"}) as r:
            assert (r.status, (await r.json())["error"]["code"]) == (401, "invalid_api_key")

    serve(smollm2_tokenizer, ["ok"], test, client_key="sk-user", api_key="sk-user")


def test_a_failure_mid_stream_is_an_error_event(smollm2_tokenizer):
    from radixserve.frontend.tokenizer_manager import GenerateChunk, GenerationError

    async def failing(requests, enforce_queue_limit=True, param_names=None):
        yield 0, GenerateChunk(requests[0].rid, "Hel", [1], [], None, 5, 1, 0)
        raise GenerationError("the scheduler lost this request")

    async def test(client, session, tm):
        tm.generate_many = failing
        body = {"model": MODEL, "max_tokens": 8, "messages": QUESTION, "stream": True}
        async with session.post("/v1/messages", json=body) as r:
            text = await r.text()
        assert r.status == 200
        last = text.strip().split("\n\n")[-1].split("\n")
        assert last[0] == "event: error"
        error = json.loads(last[1][len("data: ") :])
        assert error == {
            "type": "error",
            "error": {"type": "api_error", "message": "the scheduler lost this request"},
        }
        async with claude(client) as c:
            with pytest.raises(anthropic.APIStatusError) as info:
                async with c.messages.stream(model=MODEL, max_tokens=8, messages=QUESTION) as s:
                    await s.get_final_message()
            assert info.value.body["error"]["type"] == "api_error"

    serve(smollm2_tokenizer, [], test)


def test_stop_reasons():
    from radixserve.frontend.anthropic.serving import stop_reason

    stops = ["END"]
    assert stop_reason({"type": "length"}, True, stops) == ("max_tokens", None)
    assert stop_reason({"type": "stop", "matched": 2}, True, stops) == ("tool_use", None)
    assert stop_reason({"type": "stop", "matched": "END"}, False, stops) == (
        "stop_sequence",
        "END",
    )
    assert stop_reason({"type": "stop", "matched": 2}, False, stops) == ("end_turn", None)
    assert stop_reason(None, False, stops) == (None, None)


def test_output_config_format_is_a_json_schema_constraint(smollm2_tokenizer):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}

    async def test(client, session, tm):
        async with claude(client) as c:
            message = await c.messages.create(
                model=MODEL,
                max_tokens=20,
                messages=QUESTION,
                output_config={"format": {"type": "json_schema", "schema": schema}},
            )
            assert json.loads(message.content[0].text) == {"city": "Paris"}
            with pytest.raises(anthropic.BadRequestError) as info:
                await c.messages.create(
                    model=MODEL,
                    max_tokens=20,
                    messages=QUESTION,
                    output_config={"format": {"type": "json_schema", "schema": {"type": 3}}},
                )
            assert "output_config.format.schema" in info.value.body["error"]["message"]

    tm = serve(smollm2_tokenizer, ['{"city": "Paris"}'], test)
    assert json.loads(tm.seen[0].sampling_params.json_schema) == schema
