"""openai-agents, unmodified, with its default model (the Responses API) runs an agent with one
function tool to completion against the front end over a scripted model (scripted_server.py):
the model calls the tool, the SDK runs it and sends the result back, the model answers."""

from __future__ import annotations

import pytest
from scripted_server import MODEL, serve

agents = pytest.importorskip("agents")

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ANSWER = "It is 18C and sunny in Paris."


@pytest.mark.parametrize(("streamed", "chained"), [(False, False), (True, False), (False, True)])
def test_an_agent_with_a_function_tool_runs_to_completion(smollm2_tokenizer, streamed, chained):
    """`chained`: the SDK sends only the new items, continuing the stored response by
    previous_response_id."""
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return "18C, sunny"

    sent: list[dict] = []

    async def test(client, session, tm):
        create = client.responses.create

        async def recorded(**kwargs):
            sent.append(kwargs)
            return await create(**kwargs)

        client.responses.create = recorded
        model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
        agent = agents.Agent(
            name="weather", instructions="Answer briefly.", model=model, tools=[get_weather]
        )
        config = agents.RunConfig(tracing_disabled=True)
        question = "What is the weather in Paris?"
        if streamed:
            result = agents.Runner.run_streamed(agent, question, run_config=config)
            async for _ in result.stream_events():
                pass
        else:
            result = await agents.Runner.run(
                agent, question, run_config=config, auto_previous_response_id=chained
            )
        assert result.final_output == ANSWER

    tm = serve(smollm2_tokenizer, [CALL, ANSWER], test)
    assert calls == ["Paris"]
    if chained:  # the second call sent only the tool's output
        assert sent[1]["previous_response_id"].startswith("resp_")
        assert [item["type"] for item in sent[1]["input"]] == ["function_call_output"]
    second = tm.prompt_text(1)
    assert "Answer briefly." in second and "What is the weather in Paris?" in second
    assert "<tool_response>\n18C, sunny\n</tool_response>" in second
