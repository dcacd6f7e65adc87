"""Whole tool calls on the real server (the bundled SmolLM2, shared with test_server_api.py):
a model made to repeat its call under `tool_choice: required` and cut by `max_tokens` returns
only the calls completed before the cut, each with JSON arguments, whole and streamed alike,
with `finish_reason: length`; with room to spare, the grammar's bound ends its turn after
MAX_FORCED_CALLS calls (one without parallel tool calls)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from test_server_structured import MODEL, WEATHER

from radixserve.frontend.openai.tool_calls import MAX_FORCED_CALLS

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the weather in Paris, Rome and Tokyo?"}]


def chat(client, stream: bool, **request):
    request = {"model": MODEL, "temperature": 0, **request}
    if not stream:
        return client.chat.completions.create(**request).choices[0]
    with client.chat.completions.stream(**request) as events:
        for _ in events:  # (get_final_completion refuses answers cut at max_tokens)
            pass
        return events.current_completion_snapshot.choices[0]


def whole_calls(choice) -> list[tuple[str, dict]]:
    calls = []
    for call in choice.message.tool_calls or []:
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, WEATHER["function"]["parameters"])
        calls.append((call.function.name, arguments))
    return calls


@pytest.fixture(scope="module")
def looping() -> dict[str, int]:
    """A logit_bias that keeps the model from closing the array of calls (every token with a
    `]`), as a weak model that repeats its call does: only the grammar's bound (or max_tokens)
    ends the turn. The grammar still allows `]` after the last call allowed, so it is taken."""
    from radixserve.frontend.tokenizer import load_frontend_tokenizer
    from radixserve.model_loader.tokenizer import bundled_tokenizer, frontend_tokenizer_dir

    tokenizer = load_frontend_tokenizer(frontend_tokenizer_dir(bundled_tokenizer()))
    return {str(i): -100 for i in range(len(tokenizer)) if "]" in tokenizer.decode([i])}


REQUIRED = {"messages": QUESTION, "tools": [WEATHER], "tool_choice": "required"}


@pytest.mark.parametrize("max_tokens", [6, 100])
def test_a_looping_model_cut_by_max_tokens_returns_only_whole_calls(
    api_client, looping, max_tokens
):
    request = {**REQUIRED, "max_tokens": max_tokens, "logit_bias": looping}
    whole = chat(api_client, False, **request)
    streamed = chat(api_client, True, **request)
    assert whole_calls(streamed) == whole_calls(whole)
    assert whole.finish_reason == streamed.finish_reason == "length"
    if max_tokens == 6:  # inside the first call: nothing whole to return
        assert whole_calls(whole) == []
    else:  # ~29 tokens a call: three whole ones, the fourth cut and dropped
        assert 2 <= len(whole_calls(whole)) < MAX_FORCED_CALLS


def test_a_looping_model_stops_at_the_bound_of_calls(api_client, looping):
    choice = chat(api_client, False, **REQUIRED, max_tokens=1000, logit_bias=looping)
    assert choice.finish_reason == "tool_calls"
    assert len(whole_calls(choice)) == MAX_FORCED_CALLS


def test_without_parallel_tool_calls_the_grammar_ends_after_one_call(api_client, looping):
    choice = chat(
        api_client,
        False,
        **REQUIRED,
        max_tokens=1000,
        logit_bias=looping,
        parallel_tool_calls=False,
    )
    assert choice.finish_reason == "tool_calls"
    assert len(whole_calls(choice)) == 1
