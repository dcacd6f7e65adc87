"""The official `anthropic` and `openai` clients through a `radixserve router` process in
front of a real worker (the bundled SmolLM2, behind API keys): Messages (whole, streamed,
count_tokens, a wrong key) and Responses (a follow-up by `previous_response_id`, a streamed
one, retrieve, delete) come through as they would from the worker itself, and the router
routes the follow-ups by affinity."""

from __future__ import annotations

import re
from pathlib import Path

import anthropic
import openai
import pytest

from radixserve.bench.router import started_router

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def router(api_server, api_keys, tmp_path_factory):
    log: Path = tmp_path_factory.mktemp("router") / "router.log"
    key, admin_key = api_keys
    args = ["--api-key", key, "--admin-api-key", admin_key, "--health-check-interval", "0.5"]
    with started_router([api_server.base_url], args, log) as process:
        process.wait_ready()
        yield process


def affinity_routed(router) -> float:
    _, body = router.get("/metrics")
    found = re.findall(
        r'^radixserve_router_requests_total\{[^}]*decision="affinity"[^}]*\} (\S+)$',
        body.decode(),
        re.MULTILINE,
    )
    return sum(float(value) for value in found)


def test_messages_through_the_router(router, api_keys):
    with anthropic.Anthropic(base_url=router.base_url, api_key=api_keys[0], max_retries=0) as c:
        message = c.messages.create(
            model=MODEL, max_tokens=8, messages=QUESTION, extra_body={"temperature": 0}
        )
        assert message.type == "message" and message.content[0].text
        with c.messages.stream(
            model=MODEL, max_tokens=8, messages=QUESTION, extra_body={"temperature": 0}
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert text and final.content[0].text == text
        counted = c.messages.count_tokens(model=MODEL, messages=QUESTION)
        assert counted.input_tokens > 0
    with (
        anthropic.Anthropic(base_url=router.base_url, api_key="wrong", max_retries=0) as stranger,
        pytest.raises(anthropic.AuthenticationError) as info,
    ):
        stranger.messages.create(model=MODEL, max_tokens=4, messages=QUESTION)
    assert info.value.body["error"]["type"] == "authentication_error"  # the router's refusal


def test_responses_through_the_router(router, api_keys):
    with openai.OpenAI(
        base_url=router.base_url + "/v1", api_key=api_keys[0], max_retries=0
    ) as client:
        first = client.responses.create(model=MODEL, input="Name a colour.", max_output_tokens=8)
        before = affinity_routed(router)
        second = client.responses.create(
            model=MODEL, input="Another one.", previous_response_id=first.id, max_output_tokens=8
        )
        assert second.id != first.id
        events = list(
            client.responses.create(
                model=MODEL,
                input="And one more.",
                previous_response_id=second.id,
                max_output_tokens=8,
                stream=True,
            )
        )
        assert events[0].type == "response.created"
        assert events[-1].type in ("response.completed", "response.incomplete")  # cut at 8
        streamed = events[0].response.id
        assert client.responses.retrieve(streamed).id == streamed
        client.responses.delete(streamed)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(streamed)
    assert affinity_routed(router) - before == 4  # two follow-ups, a retrieve, a delete
