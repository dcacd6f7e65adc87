"""Request shapes of Anthropic's Messages API and their mapping onto the chat template.

Validation follows the OpenAI protocol's rules (`openai/protocol.py`): pydantic in strict mode,
every problem a 400 naming the field, and each field supported, known and ignored, or known and
refused (listed in docs/api.md); unknown fields follow the `FieldPolicy`.

A conversation becomes the OpenAI-shaped messages the chat template renders, exactly as the
OpenAI chat path builds them: `system` is the system message, an assistant turn's `tool_use`
blocks are its `tool_calls` (arguments as JSON text), its `thinking` its `reasoning_content`,
and a user turn's `tool_result` blocks are `tool` messages (before the turn's text, as Anthropic
orders them). `tool_choice` `any` is OpenAI's `required` and `tool` a named function, both
enforced by the same JSON-schema constraint.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field

from radixserve.api_errors import InvalidParameterError
from radixserve.frontend.openai.protocol import _Request, check_json_schema
from radixserve.frontend.openai.tool_calls import forced_tool_schema

# Request field names that differ from the SamplingParams field they set.
ANTHROPIC_PARAM_NAMES = {
    "max_new_tokens": "max_tokens",
    "stop": "stop_sequences",
    "json_schema": "output_config.format",
}


# ------------------------------------------------------------------------ content blocks


class TextBlock(_Request):
    type: Literal["text"]
    text: str
    # Known and ignored: prompt caching is automatic (the radix cache), citations are not made.
    cache_control: Any = None
    citations: Any = None


class UnreadableBlock(_Request):
    """Content a text model cannot read, or that only Anthropic's own tools produce: refused
    with a 400 naming the block."""

    type: Literal[
        "image",
        "document",
        "search_result",
        "container_upload",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
    ]


class ToolUseBlock(_Request):
    """A call the assistant made, sent back in the history."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: Any = None
    caller: Any = None


class ToolResultBlock(_Request):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[TextBlock | UnreadableBlock, Field(discriminator="type")]] = ""
    is_error: bool | None = None
    cache_control: Any = None

    def text(self, where: str) -> str:
        content = self.content
        if isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, UnreadableBlock):
                    raise InvalidParameterError(
                        f"{part.type} content is not supported: this model reads text only",
                        f"{where}.content.{j}",
                    )
            content = "".join(part.text for part in content)  # type: ignore[union-attr]
        return f"Error: {content}" if self.is_error else content


class ThinkingBlock(_Request):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # nothing is signed here: accepted and not checked


class RedactedThinkingBlock(_Request):
    """Thinking only Anthropic can read: ignored."""

    type: Literal["redacted_thinking"]
    data: Any = None


ContentBlock = Annotated[
    TextBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | UnreadableBlock,
    Field(discriminator="type"),
]


class MessageParam(_Request):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]

    def template_dicts(self, index: int) -> list[dict[str, Any]]:
        """The turn as OpenAI-shaped messages (what `ChatMessage.template_dict` makes): one
        assistant message with its calls and reasoning, or a user turn's tool results as
        `tool` messages followed by its text."""
        where = f"messages.{index}"
        if isinstance(self.content, str):
            return [{"role": self.role, "content": self.content}]
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        thinking: list[str] = []
        for j, block in enumerate(self.content):
            at = f"{where}.content.{j}"
            if isinstance(block, UnreadableBlock):
                raise InvalidParameterError(
                    f"{block.type} content is not supported: this model reads text only", at
                )
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ToolUseBlock | ThinkingBlock) and self.role != "assistant":
                raise InvalidParameterError(f"only assistant turns carry {block.type} blocks", at)
            elif isinstance(block, ToolResultBlock) and self.role != "user":
                raise InvalidParameterError("only user turns carry tool_result blocks", at)
            elif isinstance(block, ToolUseBlock):
                arguments = json.dumps(block.input)
                calls.append(
                    {
                        "id": block.id,
                        "type": "function",
                        "function": {"name": block.name, "arguments": arguments},
                    }
                )
            elif isinstance(block, ThinkingBlock):
                thinking.append(block.thinking)
            elif isinstance(block, ToolResultBlock):
                results.append(
                    {"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text(at)}
                )
        text = "".join(texts)
        if self.role == "user":
            return results + ([{"role": "user", "content": text}] if texts or not results else [])
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = calls
        if thinking:
            message["reasoning_content"] = "".join(thinking)
        return [message]


# ------------------------------------------------------------------------ tools


class Tool(_Request):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,128}$")
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    # "custom" (or absent): a client tool; Anthropic's server tools (web search, code
    # execution, ...) have other types and are refused.
    type: str | None = None
    # Known and ignored: forced calls always follow the schema; the rest are hints.
    strict: bool | None = None
    cache_control: Any = None
    input_examples: Any = None
    eager_input_streaming: Any = None
    defer_loading: Any = None
    allowed_callers: Any = None

    def parameters_schema(self) -> dict[str, Any]:
        return self.input_schema if self.input_schema is not None else {"type": "object"}

    def template_dict(self) -> dict[str, Any]:
        """The tool as the chat template shows it (OpenAI's function shape)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters_schema()
        return {"type": "function", "function": function}


class ToolChoiceAuto(_Request):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(_Request):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(_Request):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(_Request):
    type: Literal["none"]


ToolChoice = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone,
    Field(discriminator="type"),
]


class ThinkingConfig(_Request):
    type: Literal["enabled", "adaptive", "disabled", "between_tools"]
    # Known and ignored: the model reasons as long as it does, within max_tokens.
    budget_tokens: int | None = None
    display: Any = None


class OutputFormat(_Request):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Request):
    format: OutputFormat | None = None
    effort: Any = None  # ignored


# ------------------------------------------------------------------------ requests


class ConversationRequest(_Request):
    """What `/v1/messages` and `/v1/messages/count_tokens` share: the prompt."""

    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    # Known and ignored: they change nothing a server must generate.
    cache_control: Any = None
    speed: Any = None

    def check_supported(self) -> None:
        last = len(self.messages) - 1
        if self.messages[last].role != "user":
            raise InvalidParameterError(
                "the last message must be a user turn (assistant prefill is not supported)",
                f"messages.{last}.role",
            )
        self._check_tools()
        if self.output_config is not None and self.output_config.format is not None:
            check_json_schema(self.output_config.format.schema_, "output_config.format.schema")
        if self.forced_tool is not None and self._output_schema is not None:
            raise InvalidParameterError(
                "tool_choice and output_config.format each constrain the output; give at most one",
                "output_config.format",
            )

    def _check_tools(self) -> None:
        names: list[str] = []
        for index, tool in enumerate(self.tools or []):
            if tool.type not in (None, "custom"):
                raise InvalidParameterError(
                    f"server tools ({tool.type}) are not supported; give client tools with an "
                    "input_schema",
                    f"tools.{index}.type",
                )
            param = f"tools.{index}.input_schema"
            if tool.input_schema is None:
                raise InvalidParameterError(f"{param}: Field required", param)
            if tool.name in names:
                raise InvalidParameterError(
                    f"two tools are named {tool.name!r}", f"tools.{index}.name"
                )
            names.append(tool.name)
            check_json_schema(tool.input_schema, param)
            if tool.input_schema.get("type", "object") != "object":
                raise InvalidParameterError(
                    "a tool's input_schema must be a JSON Schema of type object", param
                )
        choice = self.tool_choice
        if isinstance(choice, ToolChoiceAny | ToolChoiceTool) and not names:
            raise InvalidParameterError(
                "tool_choice asks for a tool call but the request has no tools", "tool_choice"
            )
        if isinstance(choice, ToolChoiceTool) and choice.name not in names:
            raise InvalidParameterError(
                f"tool_choice names the tool {choice.name!r}, which is not among the tools "
                f"({', '.join(names)})",
                "tool_choice.name",
            )

    @property
    def tools_offered(self) -> bool:
        """Whether the model may call tools this turn (tool_choice none takes them away)."""
        return bool(self.tools) and not isinstance(self.tool_choice, ToolChoiceNone)

    @property
    def forced_tool(self) -> str | None:
        """OpenAI's "required" for `any`, the tool's name for `tool`, else None."""
        if not self.tools_offered:
            return None
        if isinstance(self.tool_choice, ToolChoiceTool):
            return self.tool_choice.name
        return "required" if isinstance(self.tool_choice, ToolChoiceAny) else None

    @property
    def parallel_tool_calls(self) -> bool:
        return not getattr(self.tool_choice, "disable_parallel_tool_use", None)

    @property
    def _output_schema(self) -> dict[str, Any] | None:
        config = self.output_config
        return config.format.schema_ if config is not None and config.format is not None else None

    def template_messages(self) -> list[dict[str, Any]]:
        """The conversation as OpenAI-shaped messages for `ChatTemplate.render`."""
        messages: list[dict[str, Any]] = []
        system = self.system
        if isinstance(system, list):
            system = "".join(block.text for block in system)
        if system:
            messages.append({"role": "system", "content": system})
        for index, message in enumerate(self.messages):
            messages.extend(message.template_dicts(index))
        return messages

    def template_tools(self) -> list[dict[str, Any]] | None:
        if not self.tools_offered:
            return None
        return [tool.template_dict() for tool in self.tools or []]

    def template_kwargs(self) -> dict[str, Any] | None:
        """`thinking` as the variable reasoning templates read (Qwen3's `enable_thinking`)."""
        if self.thinking is None:
            return None
        return {"enable_thinking": self.thinking.type != "disabled"}

    def constraint(self) -> dict[str, str]:
        """The structured-output constraint, as its SamplingParams field: a forced tool call's
        schema (as the OpenAI chat path builds it) or output_config.format's."""
        forced = self.forced_tool
        if forced is not None:
            schema = forced_tool_schema(
                list(self.tools or []), forced, parallel=self.parallel_tool_calls
            )
            return {"json_schema": json.dumps(schema)}
        if self._output_schema is not None:
            return {"json_schema": json.dumps(self._output_schema)}
        return {}


class CountTokensRequest(ConversationRequest):
    """`POST /v1/messages/count_tokens`."""


class MessagesRequest(ConversationRequest):
    """`POST /v1/messages`."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    # Known and ignored: billing, routing and tracing hints.
    metadata: Any = None
    service_tier: Any = None
    inference_geo: Any = None
    diagnostics: Any = None
    # Known and refused when set: Anthropic-hosted execution environments and MCP servers.
    container: Any = None
    mcp_servers: Any = None
    context_management: Any = None

    def check_supported(self) -> None:
        for name in ("container", "mcp_servers", "context_management"):
            if getattr(self, name) is not None:
                raise InvalidParameterError(f"{name} is not supported", name)
        super().check_supported()

    def sampling_dict(self) -> dict[str, Any]:
        """Keyword arguments for `SamplingParams.from_dict`."""
        return {
            "max_new_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "stop": self.stop_sequences or None,
            **self.constraint(),
        }
