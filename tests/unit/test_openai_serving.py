"""The HTTP front end with the official `openai` client over a scripted model (see
scripted_server.py): a model that calls tools under `tool_choice: auto` (which a tiny model
rarely does) is exercised end to end, streamed and not, with reasoning, request ids, API keys
and tolerant or strict fields."""

from __future__ import annotations

import json
import logging
from typing import Any

import openai
import pytest
from scripted_server import MODEL, serve

from radixserve.server_args import ServerArgs

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TWO_CALLS = (
    "Let me check both cities.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
)
FINAL_ANSWER = "Paris has 18C and sun; Rome has 21C and clouds."
QUESTION = [{"role": "user", "content": "What is the weather in Paris and Rome?"}]


def as_dicts(calls) -> list[dict[str, Any]]:
    return [{"name": c.function.name, "arguments": json.loads(c.function.arguments)} for c in calls]


EXPECTED_CALLS = [
    {"name": "get_weather", "arguments": {"city": "Paris"}},
    {"name": "get_weather", "arguments": {"city": "Rome"}},
]


# ------------------------------------------------------------------ tool calls under auto


@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_round_trip_with_two_parallel_calls(smollm2_tokenizer, stream):
    async def test(client, session, tm):
        request = {"model": MODEL, "messages": QUESTION, "tools": [WEATHER], "temperature": 0}
        if stream:
            async with client.chat.completions.stream(**request) as events:
                reply = await events.get_final_completion()
        else:
            reply = await client.chat.completions.create(**request)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == "Let me check both cities."
        calls = choice.message.tool_calls
        assert as_dicts(calls) == EXPECTED_CALLS
        assert all(c.id.startswith("call_") and c.type == "function" for c in calls)
        assert len({c.id for c in calls}) == 2

        history = [
            *QUESTION,
            choice.message.model_dump(exclude_none=True),
            *[
                {"role": "tool", "tool_call_id": call.id, "content": result}
                for call, result in zip(calls, ["18C, sunny", "21C, cloudy"], strict=True)
            ],
        ]
        final = await client.chat.completions.create(
            model=MODEL, messages=history, tools=[WEATHER], temperature=0
        )
        assert final.choices[0].message.content == FINAL_ANSWER
        assert final.choices[0].finish_reason == "stop"
        assert not final.choices[0].message.tool_calls

    tm = serve(smollm2_tokenizer, [TWO_CALLS, FINAL_ANSWER], test)
    first, second = tm.prompt_text(0), tm.prompt_text(1)
    assert json.dumps(WEATHER) in first  # the built-in template describes the tool
    # the second turn carries the calls, in Hermes form, and both results
    assert '{"name": "get_weather", "arguments": {"city": "Rome"}}' in second
    assert "<tool_response>\n18C, sunny\n</tool_response>" in second
    assert "<tool_response>\n21C, cloudy\n</tool_response>" in second


def test_streamed_tool_calls_come_whole_as_soon_as_each_closes(smollm2_tokenizer):
    """A call is one delta: `index`, `id`, `type`, `function.name` and all of
    `function.arguments` (JSON), in the chunk where the model closed it."""

    async def test(client, session, tm):
        stream = await client.chat.completions.create(
            model=MODEL, messages=QUESTION, tools=[WEATHER], stream=True
        )
        chunks = [c async for c in stream if c.choices]
        tool_deltas = [
            (k, d) for k, c in enumerate(chunks) for d in c.choices[0].delta.tool_calls or []
        ]
        assert [d.index for _, d in tool_deltas] == [0, 1]
        for _, d in tool_deltas:
            assert d.id and d.type == "function" and d.function.name == "get_weather"
        assert [json.loads(d.function.arguments) for _, d in tool_deltas] == [
            {"city": "Paris"},
            {"city": "Rome"},
        ]
        first_call_chunk, second_call_chunk = (k for k, _ in tool_deltas)
        assert first_call_chunk < second_call_chunk < len(chunks) - 1, "not held to the end"
        assert chunks[-1].choices[0].finish_reason == "tool_calls"

    serve(smollm2_tokenizer, [TWO_CALLS], test)


def test_without_parallel_tool_calls_only_the_first_call_is_returned(smollm2_tokenizer):
    async def test(client, session, tm):
        reply = await client.chat.completions.create(
            model=MODEL, messages=QUESTION, tools=[WEATHER], parallel_tool_calls=False
        )
        assert as_dicts(reply.choices[0].message.tool_calls) == EXPECTED_CALLS[:1]

    serve(smollm2_tokenizer, [TWO_CALLS], test)


def test_tool_choice_none_offers_no_tools_and_parses_no_calls(smollm2_tokenizer):
    async def test(client, session, tm):
        reply = await client.chat.completions.create(
            model=MODEL, messages=QUESTION, tools=[WEATHER], tool_choice="none"
        )
        assert reply.choices[0].message.content == TWO_CALLS
        assert reply.choices[0].message.tool_calls is None
        assert reply.choices[0].finish_reason == "stop"

    tm = serve(smollm2_tokenizer, [TWO_CALLS], test)
    assert "get_weather" not in tm.prompt_text(0)


def test_a_parser_with_special_token_markers_keeps_special_tokens(smollm2_tokenizer):
    mistral = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'

    async def test(client, session, tm):
        reply = await client.chat.completions.create(
            model=MODEL, messages=QUESTION, tools=[WEATHER]
        )
        assert as_dicts(reply.choices[0].message.tool_calls) == EXPECTED_CALLS[:1]
        plain = await client.chat.completions.create(model=MODEL, messages=QUESTION)
        assert plain.choices[0].message.content == "plain"

    tm = serve(smollm2_tokenizer, [mistral, "plain"], test, tool_call_parser="mistral")
    assert tm.seen[0].sampling_params.skip_special_tokens is False
    assert tm.seen[1].sampling_params.skip_special_tokens is True


# ------------------------------------------------------------------ reasoning


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_is_split_into_reasoning_content(smollm2_tokenizer, stream):
    output = "<think>\nParis is in France; it is spring.\n</think>\n\nIt is mild in Paris."

    async def test(client, session, tm):
        request = {"model": MODEL, "messages": QUESTION}
        if stream:
            chunks = [c async for c in await client.chat.completions.create(**request, stream=True)]
            deltas = [c.choices[0].delta for c in chunks if c.choices]
            reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
            content = "".join(d.content or "" for d in deltas)
        else:
            message = (await client.chat.completions.create(**request)).choices[0].message
            reasoning, content = message.reasoning_content, message.content
        assert reasoning == "\nParis is in France; it is spring.\n"
        assert content == "It is mild in Paris."

    serve(smollm2_tokenizer, [output], test, reasoning_parser="qwen3")


def test_reasoning_then_tool_calls(smollm2_tokenizer):
    output = "<think>I need the weather tool.</think>\n" + TWO_CALLS

    async def test(client, session, tm):
        reply = await client.chat.completions.create(
            model=MODEL, messages=QUESTION, tools=[WEATHER]
        )
        message = reply.choices[0].message
        assert message.reasoning_content == "I need the weather tool."
        assert as_dicts(message.tool_calls) == EXPECTED_CALLS

    serve(smollm2_tokenizer, [output], test, reasoning_parser="deepseek-r1")


# ------------------------------------------------------------------ request ids


def test_x_request_id_is_the_request_id_and_is_echoed(smollm2_tokenizer):
    async def test(client, session, tm):
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=QUESTION,
            n=2,
            extra_headers={"X-Request-Id": "trace-42"},
        )
        assert raw.headers["x-request-id"] == "trace-42"
        assert raw.parse().id == "chatcmpl-trace-42"
        async with session.post("/v1/completions", json={"model": MODEL, "prompt": "x"}) as r:
            generated = r.headers["X-Request-Id"]
            assert len(generated) == 32 and (await r.json())["id"] == f"cmpl-{generated}"
        async with session.get("/health", headers={"X-Request-Id": "bad id"}) as r:
            assert r.status == 400
        async with session.get("/v1/nothing-here", headers={"X-Request-Id": "t-404"}) as r:
            assert (r.status, r.headers["X-Request-Id"]) == (404, "t-404")

    tm = serve(smollm2_tokenizer, ["a", "b", "c"], test)
    assert [r.rid for r in tm.seen[:2]] == ["trace-42-0", "trace-42-1"]


# ------------------------------------------------------------------ API keys


def test_api_keys_guard_the_api_and_the_admin_endpoints(smollm2_tokenizer):
    async def test(client, session, tm):
        assert [m.id for m in (await client.models.list()).data] == [MODEL]
        async with openai.AsyncOpenAI(
            base_url=str(client.base_url), api_key="wrong", max_retries=0
        ) as stranger:
            with pytest.raises(openai.AuthenticationError) as info:
                await stranger.chat.completions.create(model=MODEL, messages=QUESTION)
            assert info.value.body["code"] == "invalid_api_key"
        user, admin = {"Authorization": "Bearer sk-user"}, {"Authorization": "Bearer sk-admin"}
        for path, headers, status in [
            ("/generate", {}, 401),
            ("/get_model_info", {}, 401),
            ("/flush_cache", user, 401),
            ("/get_server_info", {"Authorization": "sk-admin"}, 401),  # no Bearer scheme
        ]:
            method = session.post if path in ("/generate", "/flush_cache") else session.get
            async with method(path, headers=headers) as r:
                body = await r.json()
                assert (r.status, body["error"]["code"]) == (status, "invalid_api_key"), path
                assert r.headers["WWW-Authenticate"] == "Bearer"
        async with session.post("/flush_cache", headers=admin) as r:
            assert r.status == 200
        async with session.get("/get_server_info", headers=admin) as r:
            info = await r.json()
            assert (info["api_key"], info["admin_api_key"]) == ("<redacted>", "<redacted>")
        for path in ("/health", "/metrics"):
            async with session.get(path) as r:
                assert r.status == 200, path
        async with session.get("/ready") as r:
            assert r.status == 200  # open to probes, with no key

    serve(
        smollm2_tokenizer,
        ["ok"],
        test,
        client_key="sk-user",
        api_key="sk-user",
        admin_api_key="sk-admin",
    )


def test_the_admin_endpoints_take_the_api_key_when_no_admin_key_is_set(smollm2_tokenizer):
    async def test(client, session, tm):
        async with session.post("/flush_cache") as r:
            assert r.status == 401
        async with session.post("/flush_cache", headers={"Authorization": "Bearer sk-1"}) as r:
            assert r.status == 200

    serve(smollm2_tokenizer, [], test, api_key="sk-1")


def test_the_api_key_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("RADIXSERVE_API_KEY", "from-env")
    assert ServerArgs().api_key == "from-env"
    assert ServerArgs(api_key="flag").api_key == "flag"
    monkeypatch.delenv("RADIXSERVE_API_KEY")
    assert ServerArgs().api_key is None


# ------------------------------------------------------------------ tolerance and bad input


def test_unknown_fields_are_served_and_strict_api_refuses_them(smollm2_tokenizer, caplog):
    body = {
        "model": MODEL,
        "messages": QUESTION,
        "reasoning_effort": "low",
        "service_tier": "auto",
        "store": False,
        "metadata": {"team": "a"},
        "brand_new_field": {"x": 1},
    }

    async def tolerant(client, session, tm):
        async with session.post("/v1/chat/completions", json=body) as r:
            assert r.status == 200
        generate = {"text": "hi", "sampling_params": {"max_new_tokens": 2, "shiny": 1}, "rid": 7}
        async with session.post("/generate", json=generate) as r:
            assert (r.status, (await r.json())["text"]) == (200, "native")
        completion = {"model": MODEL, "prompt": "x", "user": "u", "brand_new_field": 2}
        async with session.post("/v1/completions", json=completion) as r:
            assert r.status == 200

    async def strict(client, session, tm):
        async with session.post("/v1/chat/completions", json=body) as r:
            assert r.status == 400
            assert (await r.json())["error"]["param"] == "brand_new_field"

    caplog.set_level(logging.WARNING)
    serve(smollm2_tokenizer, ["fine", "native", "completed"], tolerant)
    warnings = [r.getMessage() for r in caplog.records]
    for name in ("brand_new_field", "sampling_params.shiny", "rid"):
        assert sum(f"'{name}'" in w for w in warnings) == 1, name  # once, for all endpoints
    for known in ("reasoning_effort", "service_tier", "store", "metadata", "user"):
        assert not any(f"'{known}'" in w for w in warnings), known
    serve(smollm2_tokenizer, [], strict, strict_api=True)


def test_bad_tools_are_400s_naming_the_parameter_and_the_server_keeps_serving(smollm2_tokenizer):
    async def test(client, session, tm):
        for kwargs, param in [
            (
                {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
                "tools.0.function.name",
            ),
            (
                {
                    "tools": [WEATHER],
                    "tool_choice": {"type": "function", "function": {"name": "x"}},
                },
                "tool_choice",
            ),
        ]:
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(model=MODEL, messages=QUESTION, **kwargs)
            assert info.value.body["param"] == param
        reply = await client.chat.completions.create(model=MODEL, messages=QUESTION)
        assert reply.choices[0].message.content == "still here"

    serve(smollm2_tokenizer, ["still here"], test)
