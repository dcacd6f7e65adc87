"""Chat templating with tools: through a model's own tool-aware template, and through the
built-in rendering for templates without tool support (the bundled SmolLM2's)."""

from __future__ import annotations

import copy
import json

import pytest

from radixserve.api_errors import InvalidParameterError
from radixserve.frontend.openai.chat_template import ChatTemplate
from radixserve.frontend.openai.tool_parsers import TOOL_PARSERS

HERMES = TOOL_PARSERS["hermes"]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
ROUND_TRIP = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "content": "18C, sunny", "tool_call_id": "call_1"},
    {"role": "tool", "content": "21C, cloudy", "tool_call_id": "call_2"},
]

# A Qwen2.5-style template, cut down: it renders tools and tool calls itself.
TOOL_AWARE_TEMPLATE = """
{%- if tools %}<|im_start|>system
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{%- for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>{{ message.content }}</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}
{%- endif %}"""


@pytest.fixture(scope="module")
def smollm2(smollm2_tokenizer):
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def tool_aware(smollm2):
    tokenizer = copy.deepcopy(smollm2)
    tokenizer.chat_template = TOOL_AWARE_TEMPLATE
    return tokenizer


def test_smollm2_template_has_no_tool_support_so_the_builtin_one_is_used(smollm2):
    template = ChatTemplate(smollm2)
    assert not template.renders_tools
    text = template.render(ROUND_TRIP, [WEATHER], HERMES)
    system = text[: text.index("<|im_end|>")]
    assert json.dumps(WEATHER) in system
    assert "<tool_call>" in system  # how to call, in the parser's format
    assert "SmolLM" not in text  # our system turn replaces the template's default one
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in (
        text
    )
    # both results in one user turn, after the assistant's call
    results = "<tool_response>\n18C, sunny\n</tool_response>\n<tool_response>\n21C, cloudy"
    assert f"<|im_start|>user\n{results}" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_the_builtin_template_extends_an_existing_system_message(smollm2):
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    text = ChatTemplate(smollm2).render(messages, [WEATHER], HERMES)
    assert text.startswith("<|im_start|>system\nBe terse.\n\n# Tools")
    assert text.count("<|im_start|>system") == 1


def test_the_builtin_template_speaks_the_configured_parsers_format(smollm2):
    pythonic = TOOL_PARSERS["pythonic"]
    text = ChatTemplate(smollm2).render(ROUND_TRIP, [WEATHER], pythonic)
    assert pythonic.instructions() in text
    assert "[get_weather(city='Paris')]" in text


def test_without_tools_the_prompt_is_the_models_own_rendering(smollm2):
    messages = [{"role": "user", "content": "Hi"}]
    expected = smollm2.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ChatTemplate(smollm2).render(messages, None, HERMES) == expected


def test_a_tool_aware_template_renders_tools_and_calls_itself(tool_aware):
    template = ChatTemplate(tool_aware)
    assert template.renders_tools
    text = template.render(ROUND_TRIP, [WEATHER], HERMES)
    assert text.startswith("<|im_start|>system\n<tools>" + json.dumps(WEATHER))
    # arguments reach the template as an object, not as a JSON string inside JSON
    assert '"arguments": {"city": "Paris"}' in text
    assert "<tool_response>18C, sunny</tool_response>" in text


def test_chat_template_kwargs_reach_the_template(tool_aware):
    messages = [{"role": "user", "content": "2+2?"}]
    template = ChatTemplate(tool_aware)
    thinking = template.render(messages, None, HERMES)
    not_thinking = template.render(messages, None, HERMES, {"enable_thinking": False})
    assert "<think>" not in thinking
    assert thinking.endswith("<|im_start|>assistant\n")
    assert not_thinking.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_kwargs_that_are_apply_chat_template_parameters_are_refused(smollm2):
    with pytest.raises(InvalidParameterError) as info:
        ChatTemplate(smollm2).render(
            [{"role": "user", "content": "x"}], None, HERMES, {"tokenize": True}
        )
    assert info.value.param == "chat_template_kwargs.tokenize"


def test_a_template_that_refuses_the_messages_is_a_400_about_messages(tool_aware):
    tokenizer = copy.deepcopy(tool_aware)
    tokenizer.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(InvalidParameterError, match="roles must alternate") as info:
        ChatTemplate(tokenizer).render([{"role": "user", "content": "x"}], None, HERMES)
    assert info.value.param == "messages"


def test_no_tokenizer_or_no_template_is_a_400():
    with pytest.raises(InvalidParameterError, match="no tokenizer"):
        ChatTemplate(None).render([{"role": "user", "content": "x"}], None, HERMES)
