"""Request shapes of the three generation endpoints and their mapping onto sampling params.

Requests are validated by pydantic in strict mode (a string is not an integer, `true` is not a
number); every problem becomes an `InvalidParameterError` whose `param` names the field.
Fields fall in three groups, listed per endpoint in docs/api.md:

- supported: mapped onto sampling params, the chat template, tools or the response;
- known and ignored: they change nothing a server must honour (`user`, `store`, `metadata`,
  `service_tier`, ...), accepted silently;
- known and refused: what would silently give a different answer (`audio`, image parts, `n`
  over the limit, `suffix`): a 400 naming the field.

Fields nobody knows are ignored with one warning per field name (agent frameworks send new
ones every month); `--strict-api` refuses them instead (`FieldPolicy`).

A body is decoded by `decode_body` before any of this: strict JSON (no NaN or Infinity
literals), nested at most MAX_JSON_DEPTH levels, every string valid Unicode (a JSON escape of a
lone surrogate, "\\ud800", names its field); whatever is malformed is a 400, never a
RecursionError or an encoding error deeper in.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from typing import Annotated, Any, Literal

import jsonschema
import pydantic
from pydantic import BaseModel, ConfigDict, Field

from radixserve.api_errors import InvalidParameterError
from radixserve.catalog.constraint_kinds import (
    MAX_SCHEMA_DEPTH,
    json_depth,
    schema_features_problem,
    surrogate_problem,
)
from radixserve.frontend.openai.tool_calls import forced_tool_schema
from radixserve.logging_config import escape_control
from radixserve.sampling.sampling_params import MAX_N

logger = logging.getLogger(__name__)

MAX_COMPLETION_LOGPROBS = 5
MAX_CHAT_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0
# how deep a request body may nest (every object and array counts); a schema inside it has its
# own, lower bound (MAX_SCHEMA_DEPTH), which names the schema's parameter
MAX_JSON_DEPTH = 512
# chat_template_kwargs are template variables: a few levels are plenty
MAX_TEMPLATE_KWARGS_DEPTH = 16
# unknown field names warned about, at most: a client sending fresh names cannot grow the set
# (or the log) without bound
MAX_WARNED_FIELDS = 256
# A response_format of json_object: any JSON object.
JSON_OBJECT_SCHEMA = '{"type": "object"}'
# Request field names that differ from the SamplingParams field they set.
OPENAI_PARAM_NAMES = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "json_schema": "response_format",
}


class FieldPolicy:
    """Request fields the server does not know: ignored with one warning per field name for
    the life of the process (the default), or refused with a 400 (`--strict-api`)."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self._warned: set[str] = set()

    def check(self, unknown: list[tuple[str, str]]) -> None:
        """`unknown`: (param with list indices, field name without them) pairs."""
        if not unknown:
            return
        if self.strict:
            param = unknown[0][0]
            raise InvalidParameterError(
                f"unknown field {param!r} (this server runs with --strict-api)",
                param,
                code="unknown_field",
            )
        for _, name in unknown:
            if name not in self._warned and len(self._warned) < MAX_WARNED_FIELDS:
                self._warned.add(name)
                logger.warning(
                    "ignoring the unknown request field '%s' (reported once; --strict-api "
                    "refuses such requests)%s",
                    escape_control(name, limit=100),
                    ""
                    if len(self._warned) < MAX_WARNED_FIELDS
                    else f"; {MAX_WARNED_FIELDS} unknown names reported, no more will be",
                )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def decode_body(raw: bytes) -> Any:
    """A request body as JSON, or a 400: strict JSON (UTF-8, no NaN or Infinity), at most
    MAX_JSON_DEPTH levels deep, no lone surrogate in any string (the 400 names where)."""
    try:
        text = raw.decode("utf-8")  # JSON between systems is UTF-8 (RFC 8259), not UTF-16/32
        body = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise InvalidParameterError(
            f"the body nests more than {MAX_JSON_DEPTH} levels deep", None
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, a too-long integer
        raise InvalidParameterError(f"the body is not valid JSON: {exc}", None) from None
    # cheap bounds on the text first (a long prompt must not cost a walk of every value):
    # fewer brackets than the limit cannot nest past it, and a lone surrogate can only arrive
    # as a JSON escape (UTF-8 cannot carry one)
    brackets = text.count("[") + text.count("{")
    if brackets > MAX_JSON_DEPTH and json_depth(body) > MAX_JSON_DEPTH:
        # the top-level field that holds the depth, when there is one
        fields = body.items() if isinstance(body, dict) else []
        where = next((k for k, v in fields if json_depth(v) >= MAX_JSON_DEPTH), None)
        raise InvalidParameterError(
            f"{where or 'the body'} nests more than {MAX_JSON_DEPTH} levels deep", where
        )
    # every surrogate escape starts \ud or \uD (two finds at memory speed); a pair (an emoji sent
    # ASCII-only) costs the walk, whose strings are checked at C speed (surrogate_problem)
    if "\\ud" in text or "\\uD" in text:
        check_unicode(body)
    return body


def check_unicode(body: Any) -> None:
    """A 400 naming the first field (or key) whose string holds a lone surrogate: no tokenizer,
    regex engine or grammar compiler can encode it."""
    stack: list[tuple[Any, str]] = [(body, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            problem = surrogate_problem(value)
            if problem is not None:
                param = where or None
                raise InvalidParameterError(f"{where or 'the body'} {problem}", param)
        elif isinstance(value, dict):
            for key, item in value.items():
                at = f"{where}.{key}" if where else key
                if surrogate_problem(key) is not None:
                    raise InvalidParameterError(
                        f"a key of {where or 'the body'} holds a lone surrogate, which is not "
                        "valid Unicode",
                        where or None,
                    )
                stack.append((item, at))
        elif isinstance(value, list):
            stack.extend(
                (item, f"{where}.{i}" if where else str(i)) for i, item in enumerate(value)
            )


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", populate_by_name=True)

    @pydantic.model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """Clients send explicit nulls for what they leave unset (`"n": null`)."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k not in cls.model_fields}
        return data

    def check_supported(self) -> None:
        """Refuse values this server knows but cannot honour (after field validation)."""


def unknown_fields(model: BaseModel, path: str = "", name: str = "") -> list[tuple[str, str]]:
    """Every field of `model` and its nested models that no model declares."""
    found = [(f"{path}{key}", f"{name}{key}") for key in model.model_extra or {}]
    for field_name in type(model).model_fields:
        value = getattr(model, field_name)
        items = enumerate(value) if isinstance(value, list) else [(None, value)]
        for index, item in items:
            if isinstance(item, BaseModel):
                where = f"{path}{field_name}." + ("" if index is None else f"{index}.")
                found += unknown_fields(item, where, f"{name}{field_name}.")
    return found


def parse_request(model: type[_Request], body: Any, policy: FieldPolicy) -> Any:
    """Validate a decoded JSON body into `model`: one 400 for the first problem found."""
    if not isinstance(body, dict):
        raise InvalidParameterError("the request body must be a JSON object", None)
    try:
        request = model.model_validate(body)
    except pydantic.ValidationError as exc:
        # Of a union's failed branches, the deepest names the problem best.
        param, message = max(
            ((error_param(e["loc"]), e["msg"]) for e in exc.errors()),
            key=lambda pair: len(pair[0].split(".")) if pair[0] else 0,
        )
        raise InvalidParameterError(f"{param}: {message}", param or None) from None
    request.check_supported()
    policy.check(unknown_fields(request))
    return request


_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def error_param(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as a request param: the union branches pydantic names
    (`str`, `list[int]`, `NamedToolChoice`, a tagged union and its tag) left out."""
    parts: list[str] = []
    skip_tag = False
    for part in loc:
        if isinstance(part, int):
            parts.append(str(part))
            continue
        if skip_tag:
            skip_tag = False
            continue
        if "tagged-union" in part:
            skip_tag = True
        if "[" in part or part[:1].isupper() or part in _TYPE_NAMES:
            continue
        parts.append(part)
    return ".".join(parts)


class StreamOptions(_Request):
    include_usage: bool = False
    include_obfuscation: Any = None  # ignored: there is nothing to obfuscate against


class ResponseFormatJsonSchema(_Request):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # outputs always follow the schema


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: ResponseFormatJsonSchema | None = None


class _SamplingFields(_Request):
    """Fields both OpenAI endpoints share; the extensions (top_k, min_p, regex, ...) follow
    vLLM and SGLang."""

    model: str
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    # Known and ignored: they do not change what a server must generate.
    user: Any = None
    metadata: Any = None
    store: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None
    # Extensions.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = Field(None, ge=0)
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    stop_token_ids: list[int] | None = None
    regex: str | None = None
    ebnf: str | None = None

    def sampling_dict(self, max_new_tokens: int | None) -> dict[str, Any]:
        """Keyword arguments for `SamplingParams.from_dict` (nulls mean defaults; an unset
        max_new_tokens is filled in by the front door). Structured-output and logit-bias keys
        appear only when asked for."""
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        params: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "min_new_tokens": self.min_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "repetition_penalty": self.repetition_penalty,
            "stop": stop,
            "stop_token_ids": self.stop_token_ids,
            "ignore_eos": self.ignore_eos,
            "skip_special_tokens": self.skip_special_tokens,
            "seed": self.seed,
        }
        if self.logit_bias:
            params["logit_bias"] = parse_logit_bias(self.logit_bias)
        params.update(self.constraint)
        return params

    def constraint_sources(self) -> list[tuple[str, str, str]]:
        """(request param, SamplingParams field, constraint text) for each structured-output
        constraint the request asks for."""
        sources = []
        response_format = self.response_format
        if response_format is not None and response_format.type == "json_object":
            sources.append(("response_format", "json_schema", JSON_OBJECT_SCHEMA))
        elif response_format is not None and response_format.type == "json_schema":
            spec = response_format.json_schema
            if spec is None:
                raise InvalidParameterError(
                    "response_format of type json_schema needs a json_schema object",
                    "response_format.json_schema",
                )
            schema = spec.schema_ if spec.schema_ is not None else {"type": "object"}
            check_json_schema(schema, "response_format.json_schema.schema")
            sources.append(("response_format", "json_schema", json.dumps(schema)))
        if self.regex is not None:
            sources.append(("regex", "regex", self.regex))
        if self.ebnf is not None:
            sources.append(("ebnf", "ebnf", self.ebnf))
        return sources

    @functools.cached_property
    def constraint(self) -> dict[str, str]:
        """At most one structured-output constraint, as its SamplingParams field: built (its
        schema checked) once, by `check_supported`, and reused by `sampling_dict`."""
        sources = self.constraint_sources()
        if len(sources) > 1:
            names = " and ".join(param for param, _, _ in sources)
            raise InvalidParameterError(
                f"{names} each constrain the output; give at most one", sources[1][0]
            )
        return {field: text for _, field, text in sources}

    @property
    def include_usage_in_stream(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


def parse_logit_bias(logit_bias: dict[str, float]) -> dict[int, float]:
    """OpenAI's `{"token id": bias}` with token ids as strings; bias in [-100, 100]."""
    parsed = {}
    for key, bias in logit_bias.items():
        if not key.isdecimal() or len(key) > 20:
            raise InvalidParameterError(
                f"logit_bias keys must be token ids, got {key!r}", "logit_bias"
            )
        if not math.isfinite(bias) or abs(bias) > MAX_LOGIT_BIAS:
            raise InvalidParameterError(
                f"logit_bias values must be in [-100, 100], got {bias}", "logit_bias"
            )
        parsed[int(key)] = float(bias)
    return parsed


def check_json_schema(schema: Any, param: str) -> None:
    """A 400 naming `param` unless `schema` is a valid JSON Schema (by its own $schema draft,
    2020-12 by default)."""
    if not isinstance(schema, dict):
        raise InvalidParameterError(f"{param} must be a JSON Schema object", param)
    if json_depth(schema) > MAX_SCHEMA_DEPTH:
        raise InvalidParameterError(
            f"{param} nests more than {MAX_SCHEMA_DEPTH} levels deep", param
        )
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the top level"
        raise InvalidParameterError(
            f"{param} is not a valid JSON Schema: {exc.message} (at {where})", param
        ) from None
    except RecursionError:
        raise InvalidParameterError(f"{param} nests too deeply to be checked", param) from None
    problem = schema_features_problem(schema)
    if problem is not None:
        raise InvalidParameterError(f"{param} {problem}", param)


# ------------------------------------------------------------------------ completions


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def check_supported(self) -> None:
        if self.best_of is not None and self.best_of != self.n:
            raise InvalidParameterError("best_of other than n is not supported", "best_of")
        if self.suffix:
            raise InvalidParameterError("suffix is not supported", "suffix")
        if self.echo and self.logprobs is not None:
            raise InvalidParameterError(
                "echo with logprobs (prompt logprobs) is not supported", "echo"
            )
        if isinstance(self.prompt, list) and not self.prompt:
            raise InvalidParameterError("prompt must not be empty", "prompt")
        self.constraint  # noqa: B018 (built now: a bad one is refused first)

    def prompts(self) -> list[str | list[int]]:
        """The batch of prompts: one string, several strings, one or several token lists."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


# ------------------------------------------------------------------------ chat


class TextContentPart(_Request):
    type: Literal["text"]
    text: str


class RefusalContentPart(_Request):
    """An assistant turn's refusal, sent back in the history; read as its text."""

    type: Literal["refusal"]
    refusal: str


class UnreadableContentPart(_Request):
    """Content a text model cannot read: refused with a 400 naming the part."""

    type: Literal["image_url", "input_audio", "file"]
    image_url: Any = None
    input_audio: Any = None
    file: Any = None


ContentPart = Annotated[
    TextContentPart | RefusalContentPart | UnreadableContentPart, Field(discriminator="type")
]


class ToolCallFunction(_Request):
    name: str
    # JSON text, as OpenAI sends it; an object is taken too and written as JSON.
    arguments: str | dict[str, Any] = "{}"

    def arguments_text(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


class AssistantToolCall(_Request):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[AssistantToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    # Known and ignored in history: the assistant's refusal and annotations are not re-read.
    refusal: Any = None
    annotations: Any = None
    # Known and refused when set.
    audio: Any = None
    function_call: Any = None

    def check(self, index: int) -> None:
        where = f"messages.{index}"
        if isinstance(self.content, list):
            for j, part in enumerate(self.content):
                if isinstance(part, UnreadableContentPart):
                    raise InvalidParameterError(
                        f"{part.type} content is not supported: this model reads text only",
                        f"{where}.content.{j}",
                    )
        if self.tool_calls and self.role != "assistant":
            raise InvalidParameterError(
                "only assistant messages carry tool_calls", f"{where}.tool_calls"
            )
        if self.audio is not None:
            raise InvalidParameterError("audio is not supported", f"{where}.audio")
        if self.function_call is not None:
            raise InvalidParameterError(
                "function_call is deprecated and not supported; use tool_calls",
                f"{where}.function_call",
            )

    def text(self) -> str | None:
        content = self.content
        if isinstance(content, list):
            return "".join(
                part.text if isinstance(part, TextContentPart) else part.refusal  # type: ignore[union-attr]
                for part in content
            )
        return content

    def template_dict(self) -> dict[str, Any]:
        """The message as chat templates read it (OpenAI's shape, `developer` as `system`)."""
        message: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": self.text(),
        }
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": call.function.arguments_text(),
                    },
                }
                for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        return message


class FunctionDefinition(_Request):
    name: str = Field(pattern=r"^[\w.:-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # forced calls always follow the parameters' schema

    def parameters_schema(self) -> dict[str, Any]:
        return self.parameters if self.parameters is not None else {"type": "object"}

    def template_dict(self) -> dict[str, Any]:
        """The function as chat templates show it to the model (unknown fields left out)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters_schema()
        return function


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_CHAT_TOP_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Extensions.
    chat_template_kwargs: dict[str, Any] | None = None
    # The chat template's `reasoning_effort` variable (gpt-oss's harmony system message reads
    # it; templates without it ignore it), unless chat_template_kwargs sets it.
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    # Known and ignored.
    verbosity: Any = None
    prediction: Any = None
    # Known and refused when they ask for something other than text.
    modalities: list[str] | None = None
    audio: Any = None
    web_search_options: Any = None
    functions: Any = None
    function_call: Any = None

    @pydantic.model_validator(mode="after")
    def _effort_for_template(self) -> ChatCompletionRequest:
        if self.reasoning_effort is not None:
            effort = {"reasoning_effort": self.reasoning_effort}
            self.chat_template_kwargs = effort | (self.chat_template_kwargs or {})
        return self

    def check_supported(self) -> None:
        if self.top_logprobs and not self.logprobs:
            raise InvalidParameterError("top_logprobs needs logprobs: true", "top_logprobs")
        if json_depth(self.chat_template_kwargs) > MAX_TEMPLATE_KWARGS_DEPTH:
            # the template renderer copies them recursively
            raise InvalidParameterError(
                f"chat_template_kwargs nests more than {MAX_TEMPLATE_KWARGS_DEPTH} levels deep",
                "chat_template_kwargs",
            )
        if self.modalities is not None and set(self.modalities) - {"text"}:
            raise InvalidParameterError("only the text modality is supported", "modalities")
        for name in ("audio", "web_search_options"):
            if getattr(self, name) is not None:
                raise InvalidParameterError(f"{name} is not supported", name)
        for name in ("functions", "function_call"):
            if getattr(self, name) is not None:
                raise InvalidParameterError(
                    f"{name} is deprecated and not supported; use tools and tool_choice", name
                )
        for index, message in enumerate(self.messages):
            message.check(index)
        self._check_tools()
        self.constraint  # noqa: B018 (built now: a bad one is refused first)

    def _check_tools(self) -> None:
        names: list[str] = []
        for index, tool in enumerate(self.tools or []):
            function = tool.function
            if function.name in names:
                raise InvalidParameterError(
                    f"two tools are named {function.name!r}", f"tools.{index}.function.name"
                )
            names.append(function.name)
            param = f"tools.{index}.function.parameters"
            schema = function.parameters_schema()
            check_json_schema(schema, param)
            if schema.get("type", "object") != "object":
                raise InvalidParameterError(
                    "a function's parameters must be a JSON Schema of type object", param
                )
        choice = self.tool_choice
        forces = choice == "required" or isinstance(choice, NamedToolChoice)
        if forces and not names:
            raise InvalidParameterError(
                "tool_choice asks for a tool call but the request has no tools", "tool_choice"
            )
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise InvalidParameterError(
                f"tool_choice names the function {choice.function.name!r}, which is not among "
                f"the tools ({', '.join(names)})",
                "tool_choice",
            )

    @property
    def tools_offered(self) -> bool:
        """Whether the model may call tools this turn (tool_choice none takes them away)."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def forced_tool(self) -> str | None:
        """ "required", the named function, or None when the model chooses (or may not call)."""
        if not self.tools_offered:
            return None
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function.name
        return "required" if self.tool_choice == "required" else None

    def constraint_sources(self) -> list[tuple[str, str, str]]:
        sources = super().constraint_sources()
        forced = self.forced_tool
        if forced is not None:
            schema = forced_tool_schema(
                [tool.function for tool in self.tools or []],
                forced,
                parallel=self.parallel_tool_calls is not False,
            )
            sources.insert(0, ("tool_choice", "json_schema", json.dumps(schema)))
        return sources

    @property
    def requested_max_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


# ------------------------------------------------------------------------ native /generate


class GenerateRequestBody(_Request):
    """`POST /generate`, SGLang's native shape."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    # a LoRA adapter's name (or the base model's): which weights generate
    model: str | None = None
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0

    def known_sampling_params(
        self, known: set[str], policy: FieldPolicy
    ) -> dict[str, Any] | list[dict[str, Any]] | None:
        """sampling_params without the keys SamplingParams does not have (the policy decides
        whether that is a warning or a 400)."""
        params = self.sampling_params
        if params is None:
            return None
        objects = params if isinstance(params, list) else [params]
        unknown = []
        for index, entry in enumerate(objects):
            where = "sampling_params." + ("" if isinstance(params, dict) else f"{index}.")
            unknown += [(where + k, f"sampling_params.{k}") for k in entry if k not in known]
        policy.check(unknown)
        cleaned = [{k: v for k, v in entry.items() if k in known} for entry in objects]
        return cleaned if isinstance(params, list) else cleaned[0]
