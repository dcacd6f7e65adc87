"""A chat request rendered into the prompt text, through the model's own chat template.

Tools and tool-call history go through the model's template when it renders tools (`tools` is
one of its variables, as in the Qwen2.5/Qwen3, Llama 3.1+, Mistral and Hermes templates). For a
template without tool support (SmolLM2's, most small chat models'), a built-in rendering
stands in: the system message describes the tools and how to call them in the tool-call
parser's format, earlier calls are written as that family writes them, and tool results come
back as a user turn in `<tool_response>` tags. Any chat model can then take part in a tool
loop, and its calls are read back by the same parser.
"""

from __future__ import annotations

import functools
import inspect
import json
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.meta

from radixserve.api_errors import InvalidParameterError
from radixserve.frontend.openai.tool_parsers import ToolCall, ToolParser

if TYPE_CHECKING:  # imported when a tokenizer is loaded, after the scheduler process started
    import transformers

Message = dict[str, Any]


@functools.cache
def _reserved_kwargs() -> frozenset[str]:
    """apply_chat_template's own parameters: chat_template_kwargs may not set them."""
    import transformers

    signature = inspect.signature(transformers.PreTrainedTokenizerBase.apply_chat_template)
    return frozenset(signature.parameters) - {"self", "kwargs"}


class ChatTemplate:
    """The model's chat template, and whether it renders tools itself."""

    def __init__(self, tokenizer: transformers.PreTrainedTokenizerBase | None) -> None:
        self._tokenizer = tokenizer
        self.source = _template_source(tokenizer)
        self.renders_tools = _uses_variable(self.source, "tools")

    def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        tool_parser: type[ToolParser],
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text for `messages` (OpenAI-shaped dicts, arguments as JSON text) and
        the tools the model may call (None: none offered this turn)."""
        if self._tokenizer is None:
            raise InvalidParameterError(
                "this model has no tokenizer, so chat requests cannot be served", "messages"
            )
        if self.source is None:
            raise InvalidParameterError(
                "this model has no chat template; use /v1/completions", "messages"
            )
        kwargs = dict(template_kwargs or {})
        for key in kwargs:
            if key in _reserved_kwargs():
                raise InvalidParameterError(
                    f"chat_template_kwargs may not set {key!r}", f"chat_template_kwargs.{key}"
                )
        if self.renders_tools:
            conversation = [_native_message(m) for m in messages]
            tools_arg = tools
        else:
            conversation = _builtin_tool_messages(messages, tools, tool_parser)
            tools_arg = None
        try:
            text = self._tokenizer.apply_chat_template(
                conversation,
                tools=tools_arg,
                tokenize=False,
                add_generation_prompt=True,
                **kwargs,
            )
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise InvalidParameterError(
                f"the model's chat template cannot render these messages: {exc}", "messages"
            ) from None
        return text


def _template_source(tokenizer: transformers.PreTrainedTokenizerBase | None) -> str | None:
    if tokenizer is None or not tokenizer.chat_template:
        return None
    template = tokenizer.chat_template
    if isinstance(template, dict):  # named templates: the one apply_chat_template would pick
        return template.get("tool_use") or template.get("default")
    return template


def _uses_variable(source: str | None, name: str) -> bool:
    if source is None:
        return False
    environment = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    try:
        return name in jinja2.meta.find_undeclared_variables(environment.parse(source))
    except jinja2.TemplateSyntaxError:
        return False


def _native_message(message: Message) -> Message:
    """As Hugging Face templates expect: call arguments as objects, content never null."""
    rendered = {**message, "content": message.get("content") or ""}
    if message.get("tool_calls"):
        rendered["tool_calls"] = [
            {
                **call,
                "function": {
                    "name": call["function"]["name"],
                    "arguments": _call(call).arguments_object(),
                },
            }
            for call in message["tool_calls"]
        ]
    return rendered


def _call(call: dict[str, Any]) -> ToolCall:
    return ToolCall(call["function"]["name"], call["function"]["arguments"])


def _builtin_tool_messages(
    messages: list[Message], tools: list[dict[str, Any]] | None, parser: type[ToolParser]
) -> list[Message]:
    """Plain system/user/assistant turns carrying the tools, the calls and their results."""
    out: list[Message] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            calls = parser.format_calls([_call(c) for c in message["tool_calls"]])
            out.append({"role": "assistant", "content": f"{content}\n{calls}".strip()})
        elif role == "tool":
            response = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response, "tool_results": True})
        else:
            out.append(
                {k: v for k, v in message.items() if k != "tool_calls"} | {"content": content}
            )
    for message in out:
        message.pop("tool_results", None)
    if tools:
        described = _describe_tools(tools, parser)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + described}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


def _describe_tools(tools: list[dict[str, Any]], parser: type[ToolParser]) -> str:
    signatures = "\n".join(json.dumps(tool) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{signatures}\n</tools>\n\n{parser.instructions()}"
    )
