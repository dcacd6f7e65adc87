"""OpenAI request validation, tolerance and mapping onto sampling params, and response
shaping, without a server."""

from __future__ import annotations

import json
import logging

import jsonschema
import pytest

from radixserve.api_errors import APIError, InvalidParameterError
from radixserve.boundary import TokenLogprob
from radixserve.frontend.http_server import as_api_error
from radixserve.frontend.openai import protocol, responses
from radixserve.frontend.tokenizer_manager import (
    PromptTooLongError,
    QueueFullError,
    SchedulerUnavailableError,
)
from radixserve.sampling.sampling_params import SamplingParams

TOLERANT = protocol.FieldPolicy(strict=False)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def completion(policy=TOLERANT, **fields):
    body = {"model": "m", "prompt": "hi", **fields}
    return protocol.parse_request(protocol.CompletionRequest, body, policy)


def chat(policy=TOLERANT, **fields):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return protocol.parse_request(protocol.ChatCompletionRequest, body, policy)


def refused(build, **fields) -> InvalidParameterError:
    with pytest.raises(InvalidParameterError) as info:
        build(**fields)
    assert info.value.status == 400
    assert info.value.body()["error"]["type"] == "invalid_request_error"
    return info.value


def test_completion_defaults_follow_openai():
    req = completion()
    assert (req.max_tokens, req.n, req.stream, req.echo, req.logprobs) == (
        16,
        1,
        False,
        False,
        None,
    )


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("a", ["a"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
    ],
)
def test_every_prompt_shape_becomes_a_batch(prompt, expected):
    assert completion(prompt=prompt).prompts() == expected


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": "16"}, "max_tokens"),
        ({"temperature": True}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 0}, "n"),
        ({"n": 129}, "n"),
        ({"logprobs": 6}, "logprobs"),
        ({"presence_penalty": -3}, "presence_penalty"),
        ({"stream": "yes"}, "stream"),
        ({"prompt": [1, "a"]}, "prompt"),
        ({"stop": [1]}, "stop.0"),
        ({"echo": True, "logprobs": 1}, "echo"),
        ({"suffix": "x"}, "suffix"),
        ({"best_of": 3}, "best_of"),
        ({"prompt": []}, "prompt"),
    ],
)
def test_bad_completion_fields_are_400s_that_name_the_field(fields, param):
    error = refused(completion, **fields)
    assert error.param is not None and error.param.startswith(param)


def test_body_must_be_an_object():
    with pytest.raises(InvalidParameterError, match="JSON object"):
        protocol.parse_request(protocol.CompletionRequest, ["not", "an", "object"], TOLERANT)


def test_null_means_the_default():
    req = chat(n=None, stream=None, logprobs=None, max_tokens=None, stream_options=None)
    assert (req.n, req.stream, req.logprobs, req.requested_max_tokens) == (1, False, False, None)
    assert completion(max_tokens=None, echo=None).echo is False


def test_integers_are_accepted_for_floats():
    assert completion(temperature=1, top_p=1).temperature == 1


def test_sampling_dict_builds_valid_sampling_params():
    req = completion(stop="\n", temperature=0, top_k=5, seed=7, min_tokens=2)
    params = SamplingParams.from_dict(req.sampling_dict(max_new_tokens=10))
    params.verify(vocab_size=100)
    assert params.stop == ["\n"]
    assert (params.max_new_tokens, params.min_new_tokens, params.top_k, params.seed) == (
        10,
        2,
        5,
        7,
    )
    assert params.temperature == 0.0


def test_a_plain_request_sets_no_structured_output_or_bias_keys():
    assert not {"json_schema", "regex", "ebnf", "logit_bias"} & set(chat().sampling_dict(None))


# ------------------------------------------------------------------ tolerance


def test_unknown_fields_are_ignored_with_one_warning_per_field_name(caplog):
    policy = protocol.FieldPolicy(strict=False)
    caplog.set_level(logging.WARNING, logger=protocol.__name__)
    for _ in range(3):
        req = chat(
            policy,
            reasoning_effort="low",  # known, ignored silently
            service_tier="auto",
            store=True,
            metadata={"k": "v"},
            novel_option=1,
            messages=[{"role": "user", "content": "hi", "novel_message_field": True}],
            stream_options={"include_usage": True, "novel_stream_option": 1},
        )
        assert req.include_usage_in_stream
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3
    for name in ("novel_option", "messages.novel_message_field", "novel_stream_option"):
        assert sum(name in message for message in warned) == 1


def test_strict_api_refuses_unknown_fields_naming_them():
    strict = protocol.FieldPolicy(strict=True)
    assert refused(chat, policy=strict, novel_option=1).param == "novel_option"
    error = refused(
        chat, policy=strict, messages=[{"role": "user", "content": "x", "extra_key": 1}]
    )
    assert error.param == "messages.0.extra_key"
    assert error.code == "unknown_field"
    chat(policy=strict, store=True, user="u")  # known fields pass


def test_native_sampling_params_drop_unknown_keys_per_the_policy():
    body = protocol.parse_request(
        protocol.GenerateRequestBody,
        {"text": "x", "sampling_params": [{"temperature": 0.1, "frobnicate": 2}, {"top_k": 3}]},
        TOLERANT,
    )
    known = {"temperature", "top_k"}
    assert body.known_sampling_params(known, TOLERANT) == [{"temperature": 0.1}, {"top_k": 3}]
    with pytest.raises(InvalidParameterError) as info:
        body.known_sampling_params(known, protocol.FieldPolicy(strict=True))
    assert info.value.param == "sampling_params.0.frobnicate"


# ------------------------------------------------------------------ structured outputs


def test_json_object_maps_to_a_permissive_object_schema():
    params = chat(response_format={"type": "json_object"}).sampling_dict(None)
    assert json.loads(params["json_schema"]) == {"type": "object"}


def test_json_schema_maps_to_the_schema_serialized():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    response_format = {"type": "json_schema", "json_schema": {"name": "A", "schema": schema}}
    for build in (chat, completion):
        params = build(response_format=response_format).sampling_dict(None)
        assert json.loads(params["json_schema"]) == schema


def test_regex_and_ebnf_pass_through_as_sglang_spells_them():
    assert chat(regex=r"\d+").sampling_dict(None)["regex"] == r"\d+"
    assert completion(ebnf='root ::= "a"').sampling_dict(1)["ebnf"] == 'root ::= "a"'


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"response_format": {"type": "json_object"}, "regex": "a"}, "regex"),
        ({"regex": "a", "ebnf": "b"}, "ebnf"),
        ({"tools": [WEATHER], "tool_choice": "required", "regex": "a"}, "regex"),
    ],
)
def test_conflicting_or_bad_constraints_are_400s_naming_the_parameter(fields, param):
    assert refused(chat, **fields).param == param


def test_logit_bias_keys_become_token_ids():
    assert completion(logit_bias={"15": -100, "7": 2.5}).sampling_dict(1)["logit_bias"] == {
        15: -100.0,
        7: 2.5,
    }


@pytest.mark.parametrize("bias", [{"hello": 1.0}, {"-3": 1.0}, {"3": 101.0}])
def test_bad_logit_bias_is_a_400(bias):
    with pytest.raises(InvalidParameterError) as info:
        completion(logit_bias=bias).sampling_dict(1)
    assert info.value.param == "logit_bias"


# ------------------------------------------------------------------ tools


def forced_schema(**fields) -> dict:
    return json.loads(chat(**fields).sampling_dict(None)["json_schema"])


def test_required_tool_choice_constrains_output_to_calls_of_the_tools():
    schema = forced_schema(tools=[WEATHER, TIME], tool_choice="required")
    good = [
        {"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}},
        {"name": "get_time", "parameters": {}},
    ]
    jsonschema.validate(good, schema)
    for bad in (
        [],
        [{"name": "get_weather", "parameters": {"unit": "celsius"}}],  # city is required
        [{"name": "get_weather", "parameters": {"city": "Paris", "unit": "kelvin"}}],
        [{"name": "launch_rockets", "parameters": {}}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_without_parallel_calls_required_allows_exactly_one():
    schema = forced_schema(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    call = {"name": "get_time", "parameters": {}}
    jsonschema.validate([call], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([call, call], schema)


def test_a_named_tool_choice_constrains_output_to_its_arguments():
    named = {"type": "function", "function": {"name": "get_weather"}}
    schema = forced_schema(tools=[WEATHER, TIME], tool_choice=named)
    assert schema == WEATHER["function"]["parameters"]


def test_auto_and_none_leave_the_output_free():
    for choice in ("auto", "none", None):
        assert "json_schema" not in chat(tools=[WEATHER], tool_choice=choice).sampling_dict(None)
    assert not chat(tools=[WEATHER], tool_choice="none").tools_offered
    assert chat(tools=[WEATHER]).tools_offered


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "has space"}}]},
            "tools.0.function.name",
        ),
        ({"tools": [{"type": "function", "function": {}}]}, "tools.0.function.name"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools.0.type"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]},
            "tools.0.function.parameters",
        ),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}
                ]
            },
            "tools.0.function.parameters",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools.1.function.name"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"functions": [WEATHER["function"]]}, "functions"),
    ],
)
def test_bad_tool_definitions_and_choices_are_400s_naming_the_parameter(fields, param):
    assert refused(chat, **fields).param == param


def test_history_with_tool_calls_and_tool_results_is_accepted():
    req = chat(
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
        ],
    )
    assistant, tool = (m.template_dict() for m in req.messages[1:])
    assert assistant == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    assert tool == {"role": "tool", "content": "18C, sunny", "tool_call_id": "call_1"}


def test_chat_messages_join_text_parts_and_map_developer_to_system():
    req = chat(
        messages=[
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ]
    )
    assert [m.template_dict() for m in req.messages] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
    ]


def test_chat_max_completion_tokens_wins_over_max_tokens():
    assert chat(max_tokens=5, max_completion_tokens=7).requested_max_tokens == 7
    assert chat().requested_max_tokens is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages.0.content.0",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "hear this:"},
                            {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
                        ],
                    }
                ]
            },
            "messages.0.content.1",
        ),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        (
            {
                "messages": [
                    {"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}
                ]
            },
            "messages.0.tool_calls",
        ),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"web_search_options": {}}, "web_search_options"),
    ],
)
def test_known_but_unservable_chat_requests_are_400s_naming_the_field(fields, param):
    assert refused(chat, **fields).param == param


def test_completion_logprobs_have_offsets_and_top_maps():
    texts = {1: "Hel", 2: "lo", 3: "!"}
    entries = [TokenLogprob(1, -0.5, [(1, -0.5), (3, -1.0)]), TokenLogprob(2, -0.1, [])]
    shaped = responses.completion_logprobs(entries, texts.__getitem__, text_offset_start=4)
    assert shaped == {
        "tokens": ["Hel", "lo"],
        "token_logprobs": [-0.5, -0.1],
        "top_logprobs": [{"Hel": -0.5, "!": -1.0}, {}],
        "text_offset": [4, 7],
    }


def test_chat_logprobs_carry_utf8_bytes():
    shaped = responses.chat_logprobs([TokenLogprob(1, -0.25, [(1, -0.25)])], {1: "é"}.__getitem__)
    entry = shaped["content"][0]
    assert entry["bytes"] == [0xC3, 0xA9]
    assert entry["top_logprobs"] == [{"token": "é", "logprob": -0.25, "bytes": [0xC3, 0xA9]}]


def test_usage_reports_cached_tokens():
    assert responses.usage_dict(10, 5, 8) == {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 8},
    }


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (None, None),
        ({"type": "length"}, "length"),
        ({"type": "stop", "matched": 2}, "stop"),
        ({"type": "stop", "matched": "\n"}, "stop"),
    ],
)
def test_finish_reasons(reason, expected):
    assert responses.openai_finish_reason(reason) == expected


def test_sampling_errors_become_400s_in_openai_names():
    renamed = InvalidParameterError("max_new_tokens must be >= 0, got -1", "max_new_tokens")
    error = renamed.renamed(protocol.OPENAI_PARAM_NAMES)
    assert (error.status, error.param) == (400, "max_tokens")
    assert "max_tokens must be" in error.message


def test_engine_errors_map_to_statuses():
    full = as_api_error(QueueFullError("busy"))
    assert (full.status, full.retry_after) == (429, 1)
    down = as_api_error(SchedulerUnavailableError("gone"))
    assert (down.status, down.retry_after) == (503, 1)
    too_long = as_api_error(PromptTooLongError("too long", "messages"))
    assert (too_long.status, too_long.code, too_long.param) == (
        400,
        "context_length_exceeded",
        "messages",
    )
    assert as_api_error(RuntimeError("bug")).status == 500
    assert as_api_error(APIError("gone", status=404)).status == 404


def test_tool_call_deltas_have_openai_shape():
    first = responses.tool_call_delta(0, "call_1", "get_weather", "")
    assert first == {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert responses.tool_call_delta(0, None, None, '{"ci') == {
        "index": 0,
        "function": {"arguments": '{"ci'},
    }


def test_finish_reason_is_tool_calls_only_when_tools_were_called_before_a_stop():
    assert responses.openai_finish_reason({"type": "stop", "matched": 2}, called_tools=True) == (
        "tool_calls"
    )
    assert responses.openai_finish_reason({"type": "length"}, called_tools=True) == "length"
