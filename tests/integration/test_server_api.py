"""What real clients send, against a real server on the bundled SmolLM2 behind API keys, with
the official `openai` client: keys, tolerated and ignored fields, request ids, tools offered
and tool history, and bad tool definitions that must not take the server down."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "the city name"}},
            "required": ["city"],
        },
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def request(server, method: str, path: str, key: str | None = None, body=None):
    """(status, JSON body, headers) of one raw request."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def go():
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, server.base_url + path, json=body, headers=headers) as reply,
        ):
            return reply.status, await reply.json(content_type=None), reply.headers

    return asyncio.run(go())


# ------------------------------------------------------------------ keys


def test_the_api_needs_the_key(api_server, api_client):
    with openai.OpenAI(
        base_url=api_server.base_url + "/v1", api_key="not-the-key", max_retries=0
    ) as stranger:
        with pytest.raises(openai.AuthenticationError) as info:
            stranger.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)
        assert info.value.status_code == 401
        assert info.value.body["code"] == "invalid_api_key"
    reply = api_client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)
    assert reply.choices[0].message.role == "assistant"
    status, body, _ = request(api_server, "POST", "/generate", body={"text": "Hi"})
    assert (status, body["error"]["code"]) == (401, "invalid_api_key")


def test_probes_and_metrics_are_open_and_admin_endpoints_need_the_admin_key(api_server, api_keys):
    api_key, admin_api_key = api_keys
    for path in ("/health", "/ready", "/metrics"):
        assert api_server.get(path)[0] == 200, path
    assert request(api_server, "POST", "/flush_cache", api_key)[0] == 401
    assert request(api_server, "POST", "/flush_cache", admin_api_key)[0] == 200
    status, info, _ = request(api_server, "GET", "/get_server_info", admin_api_key)
    assert status == 200
    assert info["api_key"] == info["admin_api_key"] == "<redacted>"
    assert api_key not in json.dumps(info)
    # both processes froze their start-up heaps out of the garbage collector
    assert info["gc_frozen_objects"] > 50_000 and info["frontend"]["gc_frozen_objects"] > 10_000
    assert set(info["frontend"]["gc_collections"]) == {"0", "1", "2"}


# ------------------------------------------------------------------ tolerance, request ids


def test_fields_agent_frameworks_send_are_served(api_client):
    reply = api_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "developer", "content": "Be brief."}, *QUESTION],
        max_completion_tokens=4,
        store=False,
        metadata={"run": "ci"},
        service_tier="auto",
        reasoning_effort="low",
        user="tester",
        parallel_tool_calls=True,
        extra_body={"a_field_from_next_month": {"x": 1}, "top_k": 20},
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    completion = api_client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=2, extra_body={"another_new_field": True}
    )
    assert completion.choices[0].text is not None


def test_native_generate_tolerates_unknown_fields(api_server, api_keys):
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 2, "new_knob": 1}, "rid": 3}
    status, reply, _ = request(api_server, "POST", "/generate", api_keys[0], body)
    assert status == 200
    assert reply["meta_info"]["completion_tokens"] == 2


def test_x_request_id_is_honoured_and_echoed(api_client):
    raw = api_client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=2,
        extra_headers={"X-Request-Id": "integration-trace-1"},
    )
    assert raw.headers["x-request-id"] == "integration-trace-1"
    assert raw.parse().id == "chatcmpl-integration-trace-1"
    generated = api_client.completions.with_raw_response.create(
        model=MODEL, prompt="x", max_tokens=1
    )
    assert generated.parse().id == "cmpl-" + generated.headers["x-request-id"]


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"n": 1000}, "n"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "Transcribe:"},
                            {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
                        ],
                    }
                ]
            },
            "messages.0.content.1",
        ),
    ],
)
def test_known_fields_that_cannot_be_honoured_are_400s(api_client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as info:
        api_client.chat.completions.create(**{"model": MODEL, "messages": QUESTION, **kwargs})
    assert info.value.body["param"] == param


# ------------------------------------------------------------------ tools


def test_tools_reach_the_prompt_and_tool_choice_none_takes_them_away(api_client):
    def prompt_tokens(**kwargs) -> int:
        reply = api_client.chat.completions.create(
            model=MODEL, messages=QUESTION, max_tokens=1, **kwargs
        )
        return reply.usage.prompt_tokens

    plain = prompt_tokens()
    assert prompt_tokens(tools=[WEATHER]) > plain + 50
    assert prompt_tokens(tools=[WEATHER], tool_choice="none") == plain


def test_history_with_tool_calls_and_tool_results_is_answered(api_client):
    history = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_abc", "content": '{"temp_c": 18, "sky": "sunny"}'},
    ]
    reply = api_client.chat.completions.create(
        model=MODEL, messages=history, tools=[WEATHER], max_tokens=24, temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.content or choice.message.tool_calls


def test_a_streamed_tool_request_is_rebuilt_by_the_clients_stream_helper(api_client):
    request = {
        "model": MODEL,
        "messages": QUESTION,
        "tools": [WEATHER],
        "max_tokens": 16,
        "temperature": 0,
    }
    whole = api_client.chat.completions.create(**request).choices[0]
    with api_client.chat.completions.stream(**request) as stream:
        for _ in stream:  # (get_final_completion refuses outputs cut at max_tokens)
            pass
        streamed = stream.current_completion_snapshot.choices[0]
    assert streamed.message.content == whole.message.content
    assert streamed.finish_reason == whole.finish_reason
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls or []] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls or []
    ]


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "no spaces allowed"}}]},
            "tools.0.function.name",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "objekt"}},
                    }
                ]
            },
            "tools.0.function.parameters",
        ),
        ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
        (
            {
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "function": {"name": "get_stock_price"}},
            },
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_bad_tools_are_400s_naming_the_parameter(api_client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as info:
        api_client.chat.completions.create(
            **{"model": MODEL, "messages": QUESTION, "max_tokens": 2, **kwargs}
        )
    assert info.value.body["param"] == param


def test_the_server_keeps_serving_after_bad_requests(api_server, api_client):
    assert api_server.get("/health")[0] == 200
    reply = api_client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)
    assert reply.usage.completion_tokens >= 1
