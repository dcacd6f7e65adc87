"""OpenAI's Responses API against a real server on the bundled SmolLM2 behind API keys, with
the official `openai` client: a response cut at max_output_tokens (incomplete, as OpenAI
reports it), a streamed one continued with previous_response_id, and the stored response
fetched back."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"


def test_responses_create_stops_at_max_output_tokens(api_client):
    response = api_client.responses.create(
        model=MODEL,
        instructions="Answer in one sentence.",
        input="What is the capital of France?",
        max_output_tokens=4,
        temperature=0,
    )
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.output_text and response.usage.output_tokens <= 4
    assert response.usage.input_tokens > 0
    if response.status == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"
    else:
        assert response.status == "completed"
    assert api_client.responses.retrieve(response.id).output_text == response.output_text


def test_responses_stream_and_continue(api_client):
    with api_client.responses.stream(
        model=MODEL, input="Name a colour.", max_output_tokens=6, temperature=0
    ) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [event.sequence_number for event in events] == list(range(len(events)))
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and final.output_text == text and 0 < final.usage.output_tokens <= 6

    follow_up = api_client.responses.create(
        model=MODEL,
        input="Another one?",
        previous_response_id=final.id,
        max_output_tokens=4,
        temperature=0,
    )
    # the earlier turn is part of the prompt now
    assert follow_up.usage.input_tokens > final.usage.input_tokens + final.usage.output_tokens
