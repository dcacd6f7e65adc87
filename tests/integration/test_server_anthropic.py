"""Anthropic's Messages API against a real server on the bundled SmolLM2 behind API keys, with
the official `anthropic` client (its key travels as `x-api-key`): a message, a streamed one,
and count_tokens agreeing with the usage a message reports."""

from __future__ import annotations

import anthropic
import pytest

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def claude(api_server, api_keys):
    with anthropic.Anthropic(
        base_url=api_server.base_url, api_key=api_keys[0], max_retries=0
    ) as client:
        yield client


def test_messages_create_and_count_tokens(claude):
    message = claude.messages.create(
        model=MODEL,
        max_tokens=8,
        system="Answer in one word.",
        messages=QUESTION,
        extra_body={"temperature": 0},
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert 0 < message.usage.output_tokens <= 8
    counted = claude.messages.count_tokens(
        model=MODEL, system="Answer in one word.", messages=QUESTION
    )
    usage = message.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)


def test_messages_stream_text(claude):
    with claude.messages.stream(
        model=MODEL, max_tokens=8, messages=QUESTION, extra_body={"temperature": 0}
    ) as stream:
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    assert text and message.content[0].text == text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert 0 < message.usage.output_tokens <= 8


def test_a_wrong_key_is_an_anthropic_authentication_error(api_server):
    with (
        anthropic.Anthropic(
            base_url=api_server.base_url, api_key="wrong", max_retries=0
        ) as stranger,
        pytest.raises(anthropic.AuthenticationError) as info,
    ):
        stranger.messages.create(model=MODEL, max_tokens=4, messages=QUESTION)
    assert info.value.body["error"]["type"] == "authentication_error"
