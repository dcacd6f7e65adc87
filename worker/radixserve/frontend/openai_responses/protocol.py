"""`POST /v1/responses`: the request's shape, and its mapping onto a chat completion.

The Responses API is a chat completion underneath: `ResponsesRequest.chat_body` turns the input
items (after the stored conversation a `previous_response_id` names) into chat messages, the
function tools into chat tools, `text.format` into `response_format` and `reasoning.effort`
into a chat-template variable; `OpenAIServing.prepare_chat` then validates, renders and runs it
exactly as `/v1/chat/completions` does. Errors the chat path raises name chat fields; `ParamMap`
names them as the Responses request did (`messages.3` is `input.2`, `response_format` is
`text.format`).

Fields follow docs/api.md's three groups: supported, ignored (billing, caching and routing
hints), refused (a 400 naming the field): `background: true`, built-in tools (web search, file
search, code interpreter, computer use, image generation, MCP, ...), `conversation`, `prompt`,
non-text input parts, `include` values this server cannot produce.
"""

from __future__ import annotations

import functools
import re
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, TypeAdapter

from radixserve.api_errors import InvalidParameterError
from radixserve.frontend.openai.protocol import MAX_CHAT_TOP_LOGPROBS, _Request

# include values and what they ask for: the output text's logprobs are produced; encrypted
# reasoning is not (reasoning items carry their text instead), and asking for it is harmless
SUPPORTED_INCLUDES = frozenset({"message.output_text.logprobs", "reasoning.encrypted_content"})
# ids this server makes: `resp_` and 32 hex digits (what the store accepts as a key)
RESPONSE_ID = re.compile(r"^resp_[0-9a-f]{32}$")
# the chat-template variable `reasoning.effort` sets (gpt-oss and other templates read it)
REASONING_EFFORT_VARIABLE = "reasoning_effort"


# ------------------------------------------------------------------------ input items


class InputText(_Request):
    type: Literal["input_text"]
    text: str


class OutputText(_Request):
    """An assistant's earlier text, as output items carry it (sent back in the history)."""

    type: Literal["output_text"]
    text: str
    annotations: Any = None  # ignored in history
    logprobs: Any = None  # ignored in history


class Refusal(_Request):
    type: Literal["refusal"]
    refusal: str


class UnreadablePart(_Request):
    """Content a text model cannot read: refused with a 400 naming the part."""

    type: Literal["input_image", "input_file", "input_audio"]
    image_url: Any = None
    file_id: Any = None
    file_data: Any = None
    file_url: Any = None
    filename: Any = None
    detail: Any = None
    input_audio: Any = None


ContentPart = Annotated[
    InputText | OutputText | Refusal | UnreadablePart, Field(discriminator="type")
]


def _parts_text(parts: list[Any], where: str) -> str:
    texts = []
    for j, part in enumerate(parts):
        if isinstance(part, UnreadablePart):
            raise InvalidParameterError(
                f"{part.type} content is not supported: this model reads text only",
                f"{where}.{j}",
            )
        texts.append(part.refusal if isinstance(part, Refusal) else part.text)
    return "".join(texts)


class MessageItem(_Request):
    """A message: `{"role", "content"}` (the easy form) or an output message sent back."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]
    id: str | None = None
    status: Any = None
    phase: Any = None

    def text(self, where: str) -> str:
        if isinstance(self.content, str):
            return self.content
        return _parts_text(self.content, f"{where}.content")


class FunctionCallItem(_Request):
    """A call the model made earlier."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: Any = None
    parsed_arguments: Any = None  # the openai client's parsed copy of arguments; ignored


class FunctionCallOutputItem(_Request):
    """A call's result, as the client ran it."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: Any = None

    def text(self, where: str) -> str:
        if isinstance(self.output, str):
            return self.output
        return _parts_text(self.output, f"{where}.output")


class SummaryText(_Request):
    type: Literal["summary_text"]
    text: str


class ReasoningText(_Request):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(_Request):
    """Earlier reasoning: passed to templates that render it, as the next assistant turn's
    reasoning_content."""

    type: Literal["reasoning"]
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    id: str | None = None
    encrypted_content: Any = None  # never made here; ignored
    status: Any = None

    def text(self) -> str:
        if self.content:
            return "".join(part.text for part in self.content)
        return "\n\n".join(part.text for part in self.summary)


class UnsupportedItem(_Request):
    """Any other item type (item references, built-in tools' calls and outputs): refused."""

    type: str


_ITEM_TAGS = {
    "message": "MessageItem",
    "function_call": "FunctionCallItem",
    "function_call_output": "FunctionCallOutputItem",
    "reasoning": "ReasoningItem",
}


def _item_tag(item: Any) -> str:
    """The item model's tag (capitalized, so error params leave it out)."""
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", None)
    return _ITEM_TAGS.get(kind, "UnsupportedItem") if isinstance(kind, str) else "UnsupportedItem"


InputItem = Annotated[
    Annotated[MessageItem, Tag("MessageItem")]
    | Annotated[FunctionCallItem, Tag("FunctionCallItem")]
    | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutputItem")]
    | Annotated[ReasoningItem, Tag("ReasoningItem")]
    | Annotated[UnsupportedItem, Tag("UnsupportedItem")],
    Discriminator(_item_tag),
]


# ------------------------------------------------------------------------ tools


class FunctionTool(_Request):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # forced calls always follow the parameters' schema

    def chat_tool(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        if self.parameters is not None:
            function["parameters"] = self.parameters
        if self.strict is not None:
            function["strict"] = self.strict
        return {"type": "function", "function": function}


class BuiltinTool(_Request):
    """web_search, file_search, code_interpreter, computer_use_preview, image_generation,
    mcp, local_shell, custom, ...: tools OpenAI runs itself; refused."""

    type: str


def _tool_tag(tool: Any) -> str:
    kind = tool.get("type") if isinstance(tool, dict) else getattr(tool, "type", None)
    return "FunctionTool" if kind == "function" else "BuiltinTool"


ToolItem = Annotated[
    Annotated[FunctionTool, Tag("FunctionTool")] | Annotated[BuiltinTool, Tag("BuiltinTool")],
    Discriminator(_tool_tag),
]


class FunctionToolChoice(_Request):
    type: Literal["function"]
    name: str


class OtherToolChoice(_Request):
    """allowed_tools, a built-in tool, mcp, custom: refused."""

    type: str


def _tool_choice_tag(choice: Any) -> str:
    if isinstance(choice, str):
        return "str"
    kind = choice.get("type") if isinstance(choice, dict) else getattr(choice, "type", None)
    return "FunctionToolChoice" if kind == "function" else "OtherToolChoice"


ToolChoice = Annotated[
    Annotated[Literal["none", "auto", "required"], Tag("str")]
    | Annotated[FunctionToolChoice, Tag("FunctionToolChoice")]
    | Annotated[OtherToolChoice, Tag("OtherToolChoice")],
    Discriminator(_tool_choice_tag),
]


# ------------------------------------------------------------------------ text and reasoning


class TextFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None  # outputs always follow the schema

    def response_format(self) -> dict[str, Any] | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "json_object"}
        if self.schema_ is None:
            raise InvalidParameterError(
                "text.format of type json_schema needs a schema", "text.format.schema"
            )
        spec: dict[str, Any] = {"name": self.name or "response", "schema": self.schema_}
        if self.description is not None:
            spec["description"] = self.description
        if self.strict is not None:
            spec["strict"] = self.strict
        return {"type": "json_schema", "json_schema": spec}

    def echo(self) -> dict[str, Any]:
        echoed: dict[str, Any] = {"type": self.type}
        if self.type == "json_schema":
            echoed.update(name=self.name or "response", schema=self.schema_, strict=self.strict)
            if self.description is not None:
                echoed["description"] = self.description
        return echoed


class TextConfig(_Request):
    format: TextFormat | None = None
    verbosity: Any = None  # ignored: the model writes what it writes


class ReasoningConfig(_Request):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Any = None  # ignored: the reasoning item carries the model's reasoning as it is
    generate_summary: Any = None  # deprecated name of summary; ignored
    context: Any = None
    mode: Any = None


# ------------------------------------------------------------------------ the request


class ResponsesRequest(_Request):
    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    stream_options: Any = None  # include_obfuscation: nothing to obfuscate against; ignored
    tools: list[ToolItem] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_CHAT_TOP_LOGPROBS)
    include: list[str] | None = None
    metadata: dict[str, str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    # Known and ignored: billing, caching and routing hints; limits on built-in tools.
    user: Any = None
    service_tier: Any = None
    safety_identifier: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    max_tool_calls: Any = None
    context_management: Any = None
    # Known and refused when set.
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None

    def check_supported(self) -> None:
        if self.background:
            raise InvalidParameterError(
                "background responses are not supported: ask without background (or stream)",
                "background",
            )
        if self.conversation is not None:
            raise InvalidParameterError(
                "conversations are not supported: continue with previous_response_id",
                "conversation",
            )
        if self.prompt is not None:
            raise InvalidParameterError(
                "stored prompt templates are not supported: send instructions and input",
                "prompt",
            )
        for index, value in enumerate(self.include or []):
            if value not in SUPPORTED_INCLUDES:
                raise InvalidParameterError(
                    f"include value {value!r} is not supported (supported: "
                    f"{', '.join(sorted(SUPPORTED_INCLUDES))})",
                    f"include.{index}",
                )
        if self.metadata is not None and len(self.metadata) > 16:
            raise InvalidParameterError("metadata holds at most 16 pairs", "metadata")
        for index, tool in enumerate(self.tools or []):
            if isinstance(tool, BuiltinTool):
                raise InvalidParameterError(
                    f"the built-in tool {tool.type!r} is not supported: this server calls "
                    "function tools only",
                    f"tools.{index}.type",
                )
        if isinstance(self.tool_choice, OtherToolChoice):
            raise InvalidParameterError(
                f"tool_choice of type {self.tool_choice.type!r} is not supported (none, auto, "
                "required or a function)",
                "tool_choice",
            )
        items = self.input if isinstance(self.input, list) else []
        for index, item in enumerate(items):
            if isinstance(item, UnsupportedItem):
                raise InvalidParameterError(
                    f"input items of type {item.type!r} are not supported (message, "
                    "function_call, function_call_output, reasoning)",
                    f"input.{index}.type",
                )
        if self.previous_response_id is not None and not RESPONSE_ID.fullmatch(
            self.previous_response_id
        ):
            raise not_found_error(self.previous_response_id, "previous_response_id")

    @property
    def logprobs(self) -> bool:
        return "message.output_text.logprobs" in (self.include or [])

    def input_items(self) -> list[dict[str, Any]]:
        """This request's input as items (a string is one user message), as stored."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        return [item.model_dump(by_alias=True, exclude_none=True) for item in self.input]

    def chat_body(self, history: list[Any], source: ItemSource) -> dict[str, Any]:
        """The chat completion this response is: the messages of `history` (the stored
        conversation, already parsed) and of this request's input, the tools and the fields
        that map. `source` learns where each chat message came from."""
        messages: list[dict[str, Any]] = []
        if self.instructions is not None:
            source.add(len(messages), "instructions")
            messages.append({"role": "system", "content": self.instructions})
        append_items(messages, history, "previous_response_id", source, numbered=False)
        items = self.input if isinstance(self.input, list) else [self.input]
        append_items(messages, items, "input", source, numbered=isinstance(self.input, list))
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "stream": self.stream,
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "parallel_tool_calls": self.parallel_tool_calls,
        }
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if self.tools:
            body["tools"] = [tool.chat_tool() for tool in self.tools]  # type: ignore[union-attr]
        choice = self.tool_choice
        if isinstance(choice, FunctionToolChoice):
            body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        elif choice is not None:
            body["tool_choice"] = choice
        if self.text is not None and self.text.format is not None:
            body["response_format"] = self.text.format.response_format()
        if self.reasoning is not None and self.reasoning.effort is not None:
            body["chat_template_kwargs"] = {REASONING_EFFORT_VARIABLE: self.reasoning.effort}
        if self.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = self.top_logprobs or 0
        return body

    def echo_fields(self) -> dict[str, Any]:
        """The request fields a Response repeats (the client's models expect them)."""
        choice = self.tool_choice
        if isinstance(choice, FunctionToolChoice):
            echoed_choice: Any = {"type": "function", "name": choice.name}
        else:
            echoed_choice = choice if choice is not None else "auto"
        text_format = self.text.format if self.text is not None else None
        return {
            "instructions": self.instructions,
            "tools": [
                {
                    "type": "function",
                    "name": tool.name,  # type: ignore[union-attr]
                    "description": tool.description,  # type: ignore[union-attr]
                    "parameters": tool.parameters,  # type: ignore[union-attr]
                    "strict": tool.strict,  # type: ignore[union-attr]
                }
                for tool in self.tools or []
            ],
            "tool_choice": echoed_choice,
            "temperature": self.temperature if self.temperature is not None else 1.0,
            "top_p": self.top_p if self.top_p is not None else 1.0,
            "top_logprobs": self.top_logprobs,
            "parallel_tool_calls": self.parallel_tool_calls is not False,
            "max_output_tokens": self.max_output_tokens,
            "text": {"format": text_format.echo() if text_format is not None else {"type": "text"}},
            "reasoning": {
                "effort": self.reasoning.effort if self.reasoning is not None else None,
                "summary": None,
            },
            "metadata": self.metadata or {},
            "previous_response_id": self.previous_response_id,
            "store": self.store,
            "truncation": self.truncation or "disabled",
            "background": False,
            "user": self.user if isinstance(self.user, str) else None,
        }


def not_found_error(response_id: str, param: str | None = None) -> InvalidParameterError:
    error = InvalidParameterError(
        f"Response with id {response_id!r} not found (responses live in the memory or "
        "--responses-store-dir of the worker that made them, and only while stored: "
        "store: false keeps none, and the oldest are dropped beyond --responses-store-size)",
        param,
        code="not_found",
    )
    error.status = 404
    return error


# ------------------------------------------------------------------------ items to messages


class ItemSource:
    """Which Responses param each chat message came from, to name it in errors."""

    def __init__(self) -> None:
        self._params: dict[int, str] = {}

    def add(self, message_index: int, param: str) -> None:
        self._params.setdefault(message_index, param)

    def param(self, chat_param: str | None) -> str | None:
        """A chat param in the Responses request's terms."""
        if chat_param is None:
            return None
        head, _, rest = chat_param.partition(".")
        if head == "messages":
            index = rest.partition(".")[0]
            where = self._params.get(int(index)) if index.isdecimal() else None
            if where is None:
                return "input"
            return where
        if head == "tools":
            return re.sub(r"^tools\.(\d+)\.function\.", r"tools.\1.", chat_param)
        if head == "response_format":
            return "text.format.schema" if rest.endswith("schema") else "text.format"
        if head in ("max_tokens", "max_completion_tokens"):
            return "max_output_tokens"
        if head == "chat_template_kwargs":
            return "reasoning.effort"
        if head == "logprobs":
            return "include"
        return chat_param

    def renamed(self, error: InvalidParameterError) -> InvalidParameterError:
        param = self.param(error.param)
        if param == error.param:
            return error
        message = error.message
        if error.param and error.param in message:
            message = message.replace(error.param, param or "the request")
        renamed = InvalidParameterError(message, param, code=error.code)
        renamed.status = error.status
        return renamed


def append_items(
    messages: list[dict[str, Any]],
    items: list[Any],
    param: str,
    source: ItemSource,
    numbered: bool,
) -> None:
    """Chat messages for `items`, in order: a reasoning item becomes the next assistant
    message's reasoning_content; function calls join the assistant message before them (or a
    new one, without content), as one turn's tool_calls; their outputs become tool messages."""
    reasoning: str | None = None
    for index, item in enumerate(items):
        where = f"{param}.{index}" if numbered else param
        if isinstance(item, str):
            source.add(len(messages), where)
            messages.append({"role": "user", "content": item})
        elif isinstance(item, ReasoningItem):
            reasoning = (reasoning + "\n\n" if reasoning else "") + item.text()
        elif isinstance(item, MessageItem):
            source.add(len(messages), where)
            message: dict[str, Any] = {"role": item.role, "content": item.text(where)}
            if item.role == "assistant" and reasoning is not None:
                message["reasoning_content"] = reasoning
            reasoning = None  # reasoning before another role's message ended with its turn
            messages.append(message)
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and reasoning is None:
                last["tool_calls"] = [*(last.get("tool_calls") or []), call]
            else:
                source.add(len(messages), where)
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning is not None:
                    message["reasoning_content"], reasoning = reasoning, None
                messages.append(message)
        elif isinstance(item, FunctionCallOutputItem):
            reasoning = None
            source.add(len(messages), where)
            messages.append(
                {"role": "tool", "tool_call_id": item.call_id, "content": item.text(where)}
            )


@functools.cache
def _items_adapter() -> TypeAdapter[list[Any]]:
    return TypeAdapter(list[InputItem])


def parse_items(items: list[dict[str, Any]]) -> list[Any]:
    """Stored items (input and output, in the Responses shape) as the models above."""
    return _items_adapter().validate_python(items, strict=False) if items else []
