"""The OpenAI endpoints over the TokenizerManager's front door, independent of the HTTP server.

`prepare_completion` and `prepare_chat` validate a body, render the chat template (tools
included; off the event loop when the messages are long), map fields onto sampling params and
run the shared front door (`TokenizerManager.build_inputs`: tokenization, limits, `n` fan-out):
every 400 is raised there, before anything is admitted. The returned `PreparedRequest` then either builds the whole
response or yields stream chunks; the HTTP layer only writes them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from radixserve.api_errors import APIError, InvalidParameterError
from radixserve.boundary import TokenizedGenerateReqInput, TokenLogprob
from radixserve.frontend.openai import responses
from radixserve.frontend.openai.chat_template import ChatTemplate
from radixserve.frontend.openai.protocol import (
    OPENAI_PARAM_NAMES,
    ChatCompletionRequest,
    CompletionRequest,
    FieldPolicy,
    parse_request,
)
from radixserve.frontend.openai.reasoning_parsers import (
    REASONING_PARSERS,
    ReasoningParser,
    default_reasoning_parser,
)
from radixserve.frontend.openai.tool_calls import ChoiceOutput, forced_call_parser
from radixserve.frontend.openai.tool_parsers import (
    TOOL_PARSERS,
    CallParser,
    ToolCallDelta,
    ToolParser,
    collect_calls,
    default_tool_parser,
)
from radixserve.frontend.tokenizer_manager import (
    INLINE_TOKENIZE_CHARS,
    GenerateChunk,
    GenerateRequest,
    TokenizerManager,
)
from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)

CHUNK_OBJECT = "chat.completion.chunk"
# (input index, chunk): what a request log learns from each chunk as it passes
ChunkObserver = Callable[[int, GenerateChunk], None]


async def _observed(
    stream: AsyncIterator[tuple[int, GenerateChunk]], observe: ChunkObserver
) -> AsyncIterator[tuple[int, GenerateChunk]]:
    """`stream`, each chunk shown to `observe`; closing this closes `stream` (an abort)."""
    async with contextlib.aclosing(stream):
        async for index, chunk in stream:
            observe(index, chunk)
            yield index, chunk


@dataclass
class PreparedRequest:
    """A validated request, ready to run: `response()` for a whole reply, `events()` for the
    chunks of a stream (whichever `stream` says)."""

    stream: bool
    response: Callable[[], Any]
    events: Callable[[], AsyncIterator[dict[str, Any]]]
    samples_per_prompt: int  # n


@dataclass
class WholeOutput:
    text: str
    logprobs: list[TokenLogprob]
    last: GenerateChunk


class OpenAIServing:
    def __init__(self, tm: TokenizerManager, server_args: ServerArgs, policy: FieldPolicy) -> None:
        self.tm = tm
        self.policy = policy
        self.model_name = server_args.served_model_name or server_args.model
        self._model_names = {self.model_name, server_args.model}
        self.chat_template = ChatTemplate(tm.tokenizer)
        special_tokens = getattr(tm.tokenizer, "all_special_tokens", []) if tm.tokenizer else []
        self.tool_parser: type[ToolParser] = TOOL_PARSERS[
            server_args.tool_call_parser
            or default_tool_parser(self.chat_template.source, special_tokens)
        ]
        reasoning_parser = server_args.reasoning_parser or default_reasoning_parser(
            self.chat_template.source, special_tokens
        )
        self.reasoning_parser: type[ReasoningParser] | None = (
            REASONING_PARSERS[reasoning_parser] if reasoning_parser else None
        )
        logger.info(
            "tool calls: %s format (%s), tools rendered by %s; reasoning parser: %s",
            self.tool_parser.name,
            "--tool-call-parser" if server_args.tool_call_parser else "the model's family",
            "the chat template" if self.chat_template.renders_tools else "the built-in template",
            reasoning_parser or "off",
        )

    def check_model(self, model: str) -> str | None:
        """The LoRA adapter `model` names, None for the base model; a 404 listing what is
        served for any other name."""
        if model in self._model_names:
            return None
        if model in self.tm.lora_adapters:
            return model
        served = [self.model_name, *self.tm.lora_adapters]
        raise APIError(
            f"The model {model!r} does not exist; this server serves {served}",
            status=404,
            param="model",
            code="model_not_found",
        )

    def reply_model(self, requested: str) -> str:
        """The `model` a reply names: the adapter asked for (as vLLM answers), else the base."""
        return requested if requested in self.tm.lora_adapters else self.model_name

    def usage(self, last: dict[int, GenerateChunk], n: int) -> dict[str, Any]:
        """Usage of a request's inputs (n per prompt) from each one's last chunk."""
        prompt_tokens = cached = completion = 0
        for index, chunk in last.items():
            completion += chunk.completion_tokens
            if index % n == 0:  # the prompt counts once for its n samples
                prompt_tokens += chunk.prompt_tokens
                cached += chunk.cached_tokens
        return responses.usage_dict(prompt_tokens, completion, cached)

    def generate(
        self, inputs: list[TokenizedGenerateReqInput], observe: ChunkObserver | None
    ) -> AsyncIterator[tuple[int, GenerateChunk]]:
        """The inputs' chunks as they come, each also shown to `observe` (a request log)."""
        stream = self.tm.generate_many(inputs, param_names=OPENAI_PARAM_NAMES)
        return stream if observe is None else _observed(stream, observe)

    async def collect(
        self, inputs: list[TokenizedGenerateReqInput], observe: ChunkObserver | None
    ) -> list[WholeOutput]:
        """Run the inputs to completion: each one's text, logprobs and last chunk."""
        texts: dict[int, list[str]] = {i: [] for i in range(len(inputs))}
        logprobs: dict[int, list[TokenLogprob]] = {i: [] for i in range(len(inputs))}
        last: dict[int, GenerateChunk] = {}
        stream = self.generate(inputs, observe)
        async with contextlib.aclosing(stream):
            async for index, chunk in stream:
                texts[index].append(chunk.text)
                logprobs[index].extend(chunk.logprobs)
                last[index] = chunk
        return [WholeOutput("".join(texts[i]), logprobs[i], last[i]) for i in range(len(inputs))]

    # ---------------------------------------------------------------- completions

    async def prepare_completion(
        self, body: Any, request_id: str, observe: ChunkObserver | None = None
    ) -> PreparedRequest:
        req: CompletionRequest = parse_request(CompletionRequest, body, self.policy)
        lora_name = self.check_model(req.model)
        prompts = req.prompts()
        self.tm.check_fan_out([req.n] * len(prompts), "prompt", "n")
        sampling = {**req.sampling_dict(req.max_tokens), "n": req.n}
        inputs = await self.tm.build_inputs(
            GenerateRequest(
                prompts=prompts,
                sampling_params=[sampling] * len(prompts),
                request_id=request_id,
                return_logprob=req.logprobs is not None,
                top_logprobs_num=req.logprobs or 0,
                fill_context=True,
                sampling_param_names=OPENAI_PARAM_NAMES,
                lora_name=lora_name,
            )
        )
        echo = [
            (p if isinstance(p, str) else self.tm.decode(p)) if req.echo else "" for p in prompts
        ]
        run = _CompletionRun(self, req, inputs, f"cmpl-{request_id}", echo, observe)
        return PreparedRequest(req.stream, run.response, run.events, req.n)

    # ---------------------------------------------------------------- chat

    async def _chat_prompt(self, req: ChatCompletionRequest) -> tuple[str, list[int]]:
        """The chat's messages (and tools) through the template: the text and its tokens."""
        tools = None
        if req.tools_offered:
            tools = [
                {"type": "function", "function": t.function.template_dict()}
                for t in req.tools or []
            ]
        messages = [m.template_dict() for m in req.messages]
        args = (messages, tools, self.tool_parser, req.chat_template_kwargs)
        if _text_size(messages) <= INLINE_TOKENIZE_CHARS:
            prompt_text = self.chat_template.render(*args)
        else:
            prompt_text = await self.tm.off_loop(self.chat_template.render, *args)
        ids = await self.tm.encode(prompt_text, add_special_tokens=False, param="messages")
        return prompt_text, ids

    async def tokenize(self, body: Any) -> dict[str, Any]:
        """`POST /tokenize` (vLLM's shape): the token ids that a chat body's `messages` (with
        its tools and template arguments) or a completion's `prompt` become, exactly as
        generation tokenizes them: what `radixserve router --prefix-source events` hashes into
        KV blocks. Nothing is generated."""
        if isinstance(body, dict) and "messages" in body:
            chat = {"model": self.model_name, **body}  # the model is optional here
            _, ids = await self._chat_prompt(
                parse_request(ChatCompletionRequest, chat, self.policy)
            )
        else:
            prompt = body.get("prompt") if isinstance(body, dict) else None
            if isinstance(prompt, str):
                ids = await self.tm.encode(prompt, param="prompt")
            elif isinstance(prompt, list) and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt
            ):
                ids = prompt
            else:
                raise InvalidParameterError(
                    "give 'messages' (a chat) or 'prompt' (a string or token ids)", "prompt"
                )
        return {"tokens": ids, "count": len(ids), "max_model_len": self.tm.max_request_tokens}

    async def prepare_chat(
        self, body: Any, request_id: str, observe: ChunkObserver | None = None
    ) -> PreparedRequest:
        req: ChatCompletionRequest = parse_request(ChatCompletionRequest, body, self.policy)
        lora_name = self.check_model(req.model)
        self.tm.check_fan_out([req.n], "messages", "n")
        prompt_text, prompt_ids = await self._chat_prompt(req)
        sampling = {**req.sampling_dict(req.requested_max_tokens), "n": req.n}
        family_parses = req.tools_offered and req.forced_tool is None
        if family_parses and self.tool_parser.keeps_special_tokens:
            sampling["skip_special_tokens"] = bool(req.skip_special_tokens)
        if self.reasoning_parser is not None and self.reasoning_parser.keeps_special_tokens:
            sampling["skip_special_tokens"] = False  # its markers are special tokens
        inputs = await self.tm.build_inputs(
            GenerateRequest(
                prompts=[prompt_ids],
                sampling_params=[sampling],
                request_id=request_id,
                return_logprob=req.logprobs,
                top_logprobs_num=req.top_logprobs or 0,
                fill_context=True,
                prompt_param="messages",
                sampling_param_names=OPENAI_PARAM_NAMES,
                lora_name=lora_name,
            )
        )

        def choice_output() -> ChoiceOutput:
            calls: CallParser | None = None
            if req.forced_tool is not None:
                calls = forced_call_parser(req.forced_tool)
            elif req.tools_offered:
                calls = self.tool_parser()
            reasoning = self.reasoning_parser(prompt_text) if self.reasoning_parser else None
            return ChoiceOutput(reasoning, calls, req.parallel_tool_calls is not False)

        outputs = [choice_output() for _ in inputs]
        run = _ChatRun(self, req, inputs, f"chatcmpl-{request_id}", outputs, observe)
        return PreparedRequest(req.stream, run.response, run.events, req.n)


class _CompletionRun:
    def __init__(
        self,
        serving: OpenAIServing,
        req: CompletionRequest,
        inputs: list[TokenizedGenerateReqInput],
        response_id: str,
        echo: list[str],
        observe: ChunkObserver | None,
    ) -> None:
        self.serving, self.req, self.inputs = serving, req, inputs
        self.response_id, self.echo, self.observe = response_id, echo, observe

    def _logprobs(self, chunk_logprobs: list, offset: int = 0) -> dict[str, Any] | None:
        if self.req.logprobs is None:
            return None
        return responses.completion_logprobs(chunk_logprobs, self.serving.tm.token_text, offset)

    async def response(self) -> dict[str, Any]:
        wholes = await self.serving.collect(self.inputs, self.observe)
        choices = [
            responses.completion_choice(
                i,
                self.echo[i // self.req.n] + whole.text,
                self._logprobs(whole.logprobs),
                responses.openai_finish_reason(whole.last.finish_reason),
            )
            for i, whole in enumerate(wholes)
        ]
        usage = self.serving.usage({i: w.last for i, w in enumerate(wholes)}, self.req.n)
        model = self.serving.reply_model(self.req.model)
        return responses.completion_response(self.response_id, model, choices, usage)

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        req = self.req
        model = self.serving.reply_model(req.model)
        last: dict[int, GenerateChunk] = {}
        offsets: dict[int, int] = {}
        stream = self.serving.generate(self.inputs, self.observe)
        async with contextlib.aclosing(stream):
            async for index, chunk in stream:
                text = chunk.text
                if index not in offsets:
                    text = self.echo[index // req.n] + text
                    offsets[index] = 0
                logprobs = self._logprobs(chunk.logprobs, offsets[index])
                offsets[index] += len(text)
                last[index] = chunk
                finish = responses.openai_finish_reason(chunk.finish_reason)
                if text or finish or chunk.logprobs:
                    choice = responses.completion_choice(index, text, logprobs, finish)
                    yield responses.stream_chunk(
                        "text_completion", self.response_id, model, [choice]
                    )
        if req.include_usage_in_stream:
            usage = self.serving.usage(last, req.n)
            yield responses.stream_chunk("text_completion", self.response_id, model, [], usage)


class _ChatRun:
    def __init__(
        self,
        serving: OpenAIServing,
        req: ChatCompletionRequest,
        inputs: list[TokenizedGenerateReqInput],
        response_id: str,
        outputs: list[ChoiceOutput],
        observe: ChunkObserver | None,
    ) -> None:
        self.serving, self.req, self.inputs = serving, req, inputs
        self.response_id, self.outputs, self.observe = response_id, outputs, observe

    def _logprobs(self, chunk_logprobs: list) -> dict[str, Any] | None:
        if not self.req.logprobs:
            return None
        return responses.chat_logprobs(chunk_logprobs, self.serving.tm.token_text)

    async def response(self) -> dict[str, Any]:
        wholes = await self.serving.collect(self.inputs, self.observe)
        choices = [
            self._choice(i, whole.text, whole.logprobs, whole.last)
            for i, whole in enumerate(wholes)
        ]
        usage = self.serving.usage({i: w.last for i, w in enumerate(wholes)}, self.req.n)
        model = self.serving.reply_model(self.req.model)
        return responses.chat_response(self.response_id, model, choices, usage)

    def _choice(self, index: int, text: str, logprobs: list, last: GenerateChunk) -> dict[str, Any]:
        output = self.outputs[index]
        reasoning, content, deltas = output.feed(text, final=True)
        calls = collect_calls(deltas)
        tool_calls = [
            responses.tool_call(call_id, call.name, call.arguments)
            for call_id, call in zip(output.call_ids, calls, strict=True)
        ]
        message = responses.chat_message(
            content if content or not (tool_calls or output.parses_reasoning) else None,
            tool_calls,
            reasoning if output.parses_reasoning and reasoning else None,
            with_reasoning=output.parses_reasoning,
        )
        finish = responses.openai_finish_reason(last.finish_reason, called_tools=bool(calls))
        return responses.chat_choice(index, message, self._logprobs(logprobs), finish)

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        req = self.req
        model = self.serving.reply_model(req.model)
        last: dict[int, GenerateChunk] = {}
        stream = self.serving.generate(self.inputs, self.observe)
        async with contextlib.aclosing(stream):
            # Admission (a full queue, a request id in flight) fails on the first step: wait for
            # it before the role chunks, so such failures are plain error replies, not events.
            first = await anext(stream)
            for index in range(len(self.inputs)):
                role = responses.chat_chunk_choice(
                    index, {"role": "assistant", "content": ""}, None, None
                )
                yield responses.stream_chunk(CHUNK_OBJECT, self.response_id, model, [role])
            async for index, chunk in _prepend(first, stream):
                last[index] = chunk
                output = self.outputs[index]
                reasoning, content, deltas = output.feed(chunk.text, final=chunk.finished)
                finish = responses.openai_finish_reason(
                    chunk.finish_reason, called_tools=bool(output.call_ids)
                )
                delta = self._delta(output, reasoning, content, deltas)
                if not (delta or finish or chunk.logprobs):
                    continue
                choice = responses.chat_chunk_choice(
                    index, delta, self._logprobs(chunk.logprobs), finish
                )
                yield responses.stream_chunk(CHUNK_OBJECT, self.response_id, model, [choice])
        if req.include_usage_in_stream:
            usage = self.serving.usage(last, req.n)
            yield responses.stream_chunk(CHUNK_OBJECT, self.response_id, model, [], usage)

    @staticmethod
    def _delta(
        output: ChoiceOutput, reasoning: str, content: str, deltas: list[ToolCallDelta]
    ) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        if reasoning:
            delta["reasoning_content"] = reasoning
        if content:
            delta["content"] = content
        if deltas:
            delta["tool_calls"] = [
                responses.tool_call_delta(
                    d.index,
                    output.call_ids[d.index] if d.name is not None else None,
                    d.name,
                    d.arguments,
                )
                for d in _merged(deltas)
            ]
        return delta


def _text_size(messages: list[dict[str, Any]]) -> int:
    """About how many characters a chat's messages hold (their string parts), to decide whether
    rendering them may hold the event loop."""
    size = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            size += len(content)
        elif isinstance(content, list):
            size += sum(len(str(part)) for part in content)
        size += len(str(message.get("tool_calls") or ""))
    return size


async def _prepend(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield first
    async for item in rest:
        yield item


def _merged(deltas: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """One entry per call in a chunk: a call's name and its first argument fragment (or
    several fragments that arrived together) travel as one delta."""
    merged: list[ToolCallDelta] = []
    for delta in deltas:
        if merged and merged[-1].index == delta.index and delta.name is None:
            merged[-1] = ToolCallDelta(
                delta.index, merged[-1].name, merged[-1].arguments + delta.arguments
            )
        else:
            merged.append(ToolCallDelta(delta.index, delta.name, delta.arguments))
    return merged
