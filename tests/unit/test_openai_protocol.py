"""OpenAI request validation and response shaping, without a server."""

from __future__ import annotations

import pytest

from radixserve.entrypoints import openai_protocol as oai
from radixserve.entrypoints.engine import PromptTooLongError
from radixserve.entrypoints.http_server import as_openai_error
from radixserve.managers.io_struct import TokenLogprob
from radixserve.managers.tokenizer_manager import QueueFullError, SchedulerUnavailableError
from radixserve.sampling.sampling_params import SamplingParams


def completion(**fields):
    return oai.parse_request(oai.CompletionRequest, {"model": "m", "prompt": "hi", **fields})


def chat(**fields):
    messages = [{"role": "user", "content": "hi"}]
    return oai.parse_request(
        oai.ChatCompletionRequest, {"model": "m", "messages": messages, **fields}
    )


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
        ({"logprobs": 6}, "logprobs"),
        ({"presence_penalty": -3}, "presence_penalty"),
        ({"max_token": 5}, "max_token"),
        ({"stream": "yes"}, "stream"),
        ({"prompt": [1, "a"]}, "prompt"),
    ],
)
def test_bad_fields_are_400s_that_name_the_field(fields, param):
    with pytest.raises(oai.OpenAIError) as info:
        completion(**fields)
    assert info.value.status == 400
    assert info.value.param is not None and info.value.param.startswith(param)
    assert info.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "fields",
    [{"echo": True, "logprobs": 1}, {"suffix": "x"}, {"best_of": 3}, {"prompt": []}],
)
def test_unsupported_completion_features_are_refused(fields):
    with pytest.raises(oai.OpenAIError):
        completion(**fields)


def test_body_must_be_an_object():
    with pytest.raises(oai.OpenAIError, match="JSON object"):
        oai.parse_request(oai.CompletionRequest, ["not", "an", "object"])


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


def test_logit_bias_is_refused_rather_than_ignored():
    with pytest.raises(oai.OpenAIError, match="logit_bias"):
        completion(logit_bias={"1": 2.0}).sampling_dict(1)


def test_chat_messages_join_text_parts_and_map_developer_to_system():
    req = oai.parse_request(
        oai.ChatCompletionRequest,
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
        },
    )
    assert [m.template_dict() for m in req.messages] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
    ]


def test_chat_max_completion_tokens_wins_over_max_tokens():
    assert chat(max_tokens=5, max_completion_tokens=7).requested_max_tokens == 7
    assert chat().requested_max_tokens is None


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"top_logprobs": 2},
        {"response_format": {"type": "json_object"}},
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
    ],
)
def test_bad_chat_requests_are_refused(fields):
    with pytest.raises(oai.OpenAIError):
        chat(**fields)


def test_completion_logprobs_have_offsets_and_top_maps():
    texts = {1: "Hel", 2: "lo", 3: "!"}
    entries = [TokenLogprob(1, -0.5, [(1, -0.5), (3, -1.0)]), TokenLogprob(2, -0.1, [])]
    shaped = oai.completion_logprobs(entries, texts.__getitem__, text_offset_start=4)
    assert shaped == {
        "tokens": ["Hel", "lo"],
        "token_logprobs": [-0.5, -0.1],
        "top_logprobs": [{"Hel": -0.5, "!": -1.0}, {}],
        "text_offset": [4, 7],
    }


def test_chat_logprobs_carry_utf8_bytes():
    shaped = oai.chat_logprobs([TokenLogprob(1, -0.25, [(1, -0.25)])], {1: "é"}.__getitem__)
    entry = shaped["content"][0]
    assert entry["bytes"] == [0xC3, 0xA9]
    assert entry["top_logprobs"] == [{"token": "é", "logprob": -0.25, "bytes": [0xC3, 0xA9]}]


def test_usage_reports_cached_tokens():
    assert oai.usage_dict(10, 5, 8) == {
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
    assert oai.openai_finish_reason(reason) == expected


def test_sampling_errors_become_400s_in_openai_names():
    error = as_openai_error(ValueError("max_new_tokens must be >= 0, got -1"))
    assert (error.status, error.param) == (400, "max_tokens")
    assert "max_tokens must be" in error.message


def test_engine_errors_map_to_statuses():
    full = as_openai_error(QueueFullError("busy"))
    assert (full.status, full.retry_after) == (429, 1)
    down = as_openai_error(SchedulerUnavailableError("gone"))
    assert (down.status, down.retry_after) == (503, 1)
    too_long = as_openai_error(PromptTooLongError("too long"))
    assert (too_long.status, too_long.code) == (400, "context_length_exceeded")
