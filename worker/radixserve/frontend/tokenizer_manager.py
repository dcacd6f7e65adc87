"""The front end's side of the scheduler: normalise, tokenize, send, track, detokenize, measure.

One `TokenizerManager` lives in the front-end process, on one asyncio loop. It is the one front
door every API and the in-process Engine share: `/generate`, `/v1/completions` and
`/v1/chat/completions` (after its chat template) all reduce to a `GenerateRequest`, which
`build_inputs` validates, tokenizes and fans out into one `TokenizedGenerateReqInput` per
(prompt, sample), the one request type from here to the scheduler; errors name the offending
parameter. `generate_many` runs them and yields their chunks: the one stream every endpoint
reads.

Tokenizing never blocks the event loop: a prompt longer than `INLINE_TOKENIZE_CHARS` is
tokenized on a small thread pool (the Rust tokenizer releases the GIL), and a prompt so long
that it cannot fit the context whatever its tokens (`max_prompt_chars`) is refused before any
tokenization, so `/health` and `/ready` answer while a huge prompt arrives.

It pushes the requests to the scheduler process over pyzmq, receives
`BatchReqOutput` deltas on a background task and routes them to per-request queues, which
`generate` turns into text chunks. A request whose consumer goes away (client disconnect,
cancelled task, closed generator) is aborted in the scheduler so that its KV slots are freed.
The scheduler process is watched through its sentinel: when it dies every waiting request
fails at once instead of hanging, and `scheduler_alive` turns false for `/health`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import dataclasses
import functools
import logging
import multiprocessing.process
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from radixserve.api_errors import APIError, InvalidParameterError
from radixserve.boundary import (
    AbortReq,
    BatchReqOutput,
    FlushCacheReq,
    FlushCacheReqOutput,
    GetServerInfoReq,
    GetServerInfoReqOutput,
    LoRAAdapterReq,
    LoRAAdapterReqOutput,
    ReqOutput,
    TokenizedGenerateReqInput,
    TokenLogprob,
)
from radixserve.catalog.constraint_kinds import surrogate_problem
from radixserve.frontend.detokenizer import IncrementalDetokenizer, StopStringTrimmer
from radixserve.metrics.collectors import ServerMetrics
from radixserve.sampling.sampling_params import SAMPLING_PARAM_FIELDS, SamplingParams

if TYPE_CHECKING:  # loaded by the engine once the scheduler process has started importing
    from transformers import PreTrainedTokenizerBase as Tokenizer

logger = logging.getLogger(__name__)

FLUSH_RETRY_S = 2.0
MAX_TOP_LOGPROBS = 20
# Prompts up to this many characters are tokenized on the event loop (well under a
# millisecond); longer ones on TEXT_THREADS threads, whose Rust tokenizer releases the GIL.
INLINE_TOKENIZE_CHARS = 16_384
TEXT_THREADS = 2
# how /generate (and in-process callers) spell SamplingParams fields in errors
NATIVE_PARAM_NAMES = {name: f"sampling_params.{name}" for name in SAMPLING_PARAM_FIELDS}


class SchedulerUnavailableError(RuntimeError):
    """The scheduler process is gone; nothing can be generated any more."""


class QueueFullError(RuntimeError):
    """More requests wait for admission than `--max-queued-requests` allows."""


class RequestAbortedError(RuntimeError):
    """The scheduler aborted the request (drain timeout, flush, an explicit abort)."""


class GenerationError(RuntimeError):
    """The scheduler finished the request with an error."""


class DuplicateRequestIdError(APIError):
    """A request id (X-Request-Id) that a request still in flight already uses."""

    def __init__(self, rid: str) -> None:
        super().__init__(
            f"request id {rid!r} is already in flight", status=409, code="duplicate_request_id"
        )


class PromptTooLongError(InvalidParameterError):
    """The prompt (plus the tokens asked for) does not fit the context or the KV cache."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message, param, code="context_length_exceeded")


@dataclass
class GenerateRequest:
    """One API request reduced to what every endpoint shares: a batch of prompts (text or token
    ids) with their sampling parameters. `build_inputs` turns it into one
    `TokenizedGenerateReqInput` per (prompt, sample)."""

    prompts: list[str | list[int]]
    # One entry per prompt: a SamplingParams, or a JSON-style dict for SamplingParams.from_dict.
    sampling_params: list[dict[str, Any] | SamplingParams]
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    return_logprob: bool = False
    top_logprobs_num: int = 0
    # An unset max_new_tokens means "up to the context" (OpenAI's rule) instead of the
    # SamplingParams default (the native API's).
    fill_context: bool = False
    # The request field that holds the prompts, for errors about them.
    prompt_param: str = "prompt"
    # How the request spells SamplingParams fields, for errors about them
    # (OpenAI: max_new_tokens is max_tokens; native: temperature is sampling_params.temperature).
    sampling_param_names: dict[str, str] = field(default_factory=dict)
    # the LoRA adapter the request's `model` names (None: the base model)
    lora_name: str | None = None

    @classmethod
    def native(
        cls,
        text: str | list[str] | None,
        input_ids: list[int] | list[list[int]] | None,
        sampling_params: dict | SamplingParams | list | None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        request_id: str | None = None,
    ) -> tuple[GenerateRequest, bool]:
        """The native API's shapes (`/generate`, `Engine.generate`): one prompt or a batch, as
        text or token ids, with one sampling-params object or one per prompt. Returns the
        request and whether the caller sent a batch."""
        if (text is None) == (input_ids is None):
            raise InvalidParameterError("give exactly one of text (prompt) and input_ids", "text")
        prompts: list[Any]
        if text is not None:
            batched = isinstance(text, list)
            prompts = text if batched else [text]
            if not all(isinstance(p, str) for p in prompts):
                raise InvalidParameterError("text must be a string or a list of strings", "text")
            param = "text"
        else:
            batched = isinstance(input_ids, list) and bool(input_ids)
            batched = batched and isinstance(input_ids[0], list)
            prompts = input_ids if batched else [input_ids]
            param = "input_ids"
        if isinstance(sampling_params, list):
            params_list = list(sampling_params)
        else:
            params_list = [sampling_params] * len(prompts)
        request = cls(
            prompts=prompts,
            sampling_params=params_list,
            return_logprob=return_logprob,
            top_logprobs_num=top_logprobs_num,
            prompt_param=param,
            sampling_param_names=NATIVE_PARAM_NAMES,
        )
        if request_id is not None:
            request.request_id = request_id
        return request, batched


@dataclass
class GenerateChunk:
    """What one request produced since its previous chunk."""

    rid: str
    text: str
    token_ids: list[int]
    # One entry per released token; tokens cut with a stop string are dropped.
    logprobs: list[TokenLogprob]
    finish_reason: dict[str, Any] | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    # a pooling request's embedding or score, float32 little-endian (ReqOutput.pooled)
    pooled: bytes | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class _RequestState:
    input: TokenizedGenerateReqInput
    outputs: asyncio.Queue
    detokenizer: IncrementalDetokenizer | None
    trimmer: StopStringTrimmer
    created: float = field(default_factory=time.perf_counter)
    last_token_time: float | None = None
    got_first_output: bool = False
    # Start offset of each output token's text, kept when logprobs are asked for.
    token_offsets: list[int] = field(default_factory=list)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    # The engine's own prefill of a shared prompt before its `n` samples (`prefill_only`):
    # kept out of the request metrics.
    internal: bool = False
    # How the request spells SamplingParams fields (GenerateRequest.sampling_param_names), for
    # the scheduler's errors about them (a constraint that does not compile)
    param_names: Mapping[str, str] = field(default_factory=dict)


class TokenizerManager:
    def __init__(
        self,
        tokenizer: Tokenizer | None,
        scheduler_input_ipc_name: str,
        tokenizer_ipc_name: str,
        scheduler_process: multiprocessing.process.BaseProcess,
        metrics: ServerMetrics,
        max_queued_requests: int,
        vocab_size: int,
        max_request_tokens: int,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        # A request's prompt plus its new tokens must fit this (the context and the KV cache).
        self.max_request_tokens = max_request_tokens
        self.metrics = metrics
        self.max_queued_requests = max_queued_requests
        self._scheduler_input_ipc_name = scheduler_input_ipc_name
        self._tokenizer_ipc_name = tokenizer_ipc_name
        self._scheduler_process = scheduler_process
        self._states: dict[str, _RequestState] = {}
        self._flush_replies: deque[asyncio.Future] = deque()
        self._info_replies: deque[asyncio.Future] = deque()
        self._lora_replies: dict[str, asyncio.Future] = {}  # by LoRAAdapterReq.req_id
        # the LoRA adapters served (name -> path): the scheduler's word after each change
        self.lora_adapters: dict[str, str] = {}
        self._scheduler_error: str | None = None
        self._recv_task: asyncio.Task | None = None
        # when the scheduler loop last reported (a step's outputs, or an idle heartbeat)
        self.last_scheduler_report = time.monotonic()
        # Long prompts and chat templates are tokenized and rendered here, off the event loop.
        self._text_pool = concurrent.futures.ThreadPoolExecutor(
            TEXT_THREADS, thread_name_prefix="radixserve-tokenize"
        )
        self.max_prompt_chars = max_prompt_chars(tokenizer, max_request_tokens)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Open the sockets and start routing outputs; call on the loop that will use it."""
        loop = asyncio.get_running_loop()
        self._context = zmq.Context()
        self._send_socket = self._context.socket(zmq.PUSH)
        self._send_socket.setsockopt(zmq.LINGER, 0)
        self._send_socket.connect(self._scheduler_input_ipc_name)
        self._recv_socket = zmq.asyncio.Socket.from_socket(self._context.socket(zmq.PULL))
        self._recv_socket.setsockopt(zmq.LINGER, 0)
        self._recv_socket.bind(self._tokenizer_ipc_name)
        self._recv_task = loop.create_task(self._receive_loop())
        loop.add_reader(self._scheduler_process.sentinel, self._on_scheduler_exit)
        if not self._scheduler_process.is_alive():
            self._on_scheduler_exit()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self._scheduler_process.sentinel)
        if self._recv_task is not None:
            self._recv_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._recv_task
        self._recv_socket.close(linger=0)
        self._send_socket.close(linger=0)
        self._context.term()
        self._text_pool.shutdown(wait=False, cancel_futures=True)

    @property
    def scheduler_alive(self) -> bool:
        recv_running = self._recv_task is not None and not self._recv_task.done()
        return self._scheduler_error is None and recv_running

    @property
    def num_in_flight(self) -> int:
        return sum(1 for s in self._states.values() if not s.internal)

    @property
    def num_waiting_first_output(self) -> int:
        """Client requests not yet answered by the scheduler: a bound on its queue."""
        return sum(1 for s in self._states.values() if not s.got_first_output and not s.internal)

    def _on_scheduler_exit(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self._scheduler_process.sentinel)
        # The sentinel fires as the process ends; a moment later its exit code is known.
        self._scheduler_process.join(timeout=0.5)
        self._fail_everything(
            f"the scheduler process exited (exit code {self._scheduler_process.exitcode})"
        )

    def _fail_everything(self, message: str) -> None:
        if self._scheduler_error is None:
            logger.error("%s; failing %d in-flight requests", message, len(self._states))
            self._scheduler_error = message
        for state in self._states.values():
            state.outputs.put_nowait(SchedulerUnavailableError(message))
        for future in (*self._flush_replies, *self._info_replies, *self._lora_replies.values()):
            if not future.done():
                future.set_exception(SchedulerUnavailableError(message))

    def _send(self, message: object) -> None:
        if self._scheduler_error is not None:
            raise SchedulerUnavailableError(self._scheduler_error)
        try:
            self._send_socket.send_pyobj(message, flags=zmq.NOBLOCK)
        except zmq.Again as exc:
            raise SchedulerUnavailableError("the scheduler is not taking requests") from exc

    async def _receive_loop(self) -> None:
        try:
            while True:
                message = await self._recv_socket.recv_pyobj()
                self._dispatch(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a broken socket or an unpicklable message
            logger.exception("receiving from the scheduler failed")
            self._fail_everything(f"receiving from the scheduler failed: {exc!r}")

    def _dispatch(self, message: object) -> None:
        if isinstance(message, BatchReqOutput):
            self.last_scheduler_report = time.monotonic()
            for output in message.outputs:
                state = self._states.get(output.rid)
                if state is not None:
                    state.outputs.put_nowait(output)
            if message.stats is not None:
                self.metrics.apply_scheduler_stats(message.stats)
        elif isinstance(message, FlushCacheReqOutput):
            _resolve_next(self._flush_replies, message)
        elif isinstance(message, GetServerInfoReqOutput):
            _resolve_next(self._info_replies, message)
        elif isinstance(message, LoRAAdapterReqOutput):
            future = self._lora_replies.pop(message.req_id, None)
            if future is not None and not future.done():
                future.set_result(message)
        else:
            logger.warning("ignoring unexpected message from the scheduler: %r", type(message))

    # ---------------------------------------------------------------- requests

    async def build_inputs(self, request: GenerateRequest) -> list[TokenizedGenerateReqInput]:
        """Validate and tokenize a request; one input per (prompt, sample), `n` fanned out.

        Request ids: the request's own for a single input, `{id}-{k}` for the k-th of several.
        Raises InvalidParameterError (a 400 naming the parameter) on anything malformed."""
        if not request.prompts:
            raise InvalidParameterError("the batch of prompts is empty", request.prompt_param)
        if len(request.sampling_params) != len(request.prompts):
            raise InvalidParameterError(
                "sampling_params must be one object or one per prompt", "sampling_params"
            )
        if not isinstance(request.return_logprob, bool):
            raise InvalidParameterError("return_logprob must be a boolean", "return_logprob")
        top = request.top_logprobs_num
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise InvalidParameterError(
                f"top_logprobs_num must be an integer in [0, {MAX_TOP_LOGPROBS}]",
                "top_logprobs_num",
            )
        prompt_ids = [await self._prompt_ids(p, request.prompt_param) for p in request.prompts]
        inputs = []
        for ids, raw_params in zip(prompt_ids, request.sampling_params, strict=True):
            try:
                params = self._sampling_params(raw_params, len(ids), request.fill_context)
            except InvalidParameterError as exc:
                raise exc.renamed(request.sampling_param_names) from None
            self.check_prompt_length(len(ids), params.max_new_tokens, request.prompt_param)
            for sample in range(params.n):
                copy = dataclasses.replace(params, n=1)
                if params.seed is not None and params.n > 1:
                    copy.seed = (params.seed + sample) % 2**64
                inputs.append(
                    TokenizedGenerateReqInput(
                        rid="",
                        input_ids=list(ids),
                        sampling_params=copy,
                        stream=True,
                        return_logprob=request.return_logprob,
                        top_logprobs_num=top,
                        lora_name=request.lora_name,
                    )
                )
        if len(inputs) == 1:
            inputs[0].rid = request.request_id
        else:
            for k, item in enumerate(inputs):
                item.rid = f"{request.request_id}-{k}"
        return inputs

    async def _prompt_ids(self, prompt: str | list[int], param: str) -> list[int]:
        if isinstance(prompt, str):
            return await self.encode(prompt, param=param)
        if not isinstance(prompt, list) or not all(
            _is_token_id(t, self.vocab_size) for t in prompt
        ):
            raise InvalidParameterError(
                f"{param} must be text or a list of token ids in [0, {self.vocab_size})", param
            )
        return prompt

    def _sampling_params(
        self, params: dict[str, Any] | SamplingParams | None, prompt_len: int, fill_context: bool
    ) -> SamplingParams:
        if params is None:
            params = {}
        if isinstance(params, dict):
            if fill_context and params.get("max_new_tokens") is None:
                params = {**params, "max_new_tokens": max(self.max_request_tokens - prompt_len, 0)}
            params = SamplingParams.from_dict(params)
        elif not isinstance(params, SamplingParams):
            raise InvalidParameterError("sampling_params must be an object", "sampling_params")
        params.verify(self.vocab_size, self.max_request_tokens)
        return params

    def check_prompt_length(self, prompt_tokens: int, max_new_tokens: int, param: str) -> None:
        """A request's prompt plus its new tokens must fit the context and the KV cache."""
        limit = self.max_request_tokens
        if prompt_tokens == 0:
            raise InvalidParameterError("the prompt is empty", param)
        if prompt_tokens >= limit:
            raise PromptTooLongError(
                f"This model's maximum context length is {limit} tokens, but the prompt has "
                f"{prompt_tokens} tokens. Please shorten the prompt.",
                param,
            )
        if prompt_tokens + max_new_tokens > limit:
            raise PromptTooLongError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + max_new_tokens} tokens ({prompt_tokens} in the prompt, "
                f"{max_new_tokens} for the completion). Please reduce the prompt or max tokens.",
                param,
            )

    def check_capacity(self, num_requests: int) -> None:
        """Refuse work up front instead of letting the scheduler's queue grow without bound.
        More requests than the queue can ever hold are the client's mistake, a 400 (a 429
        would invite retries that can never succeed); `check_fits_queue` names the field."""
        if self._scheduler_error is not None:
            raise SchedulerUnavailableError(self._scheduler_error)
        if num_requests > self.max_queued_requests:
            raise InvalidParameterError(
                f"this request fans out into {num_requests} generations, more than the queue "
                f"can ever hold (--max-queued-requests {self.max_queued_requests}); split it",
                None,
            )
        if self.num_waiting_first_output + num_requests > self.max_queued_requests:
            raise QueueFullError(
                f"{self.num_waiting_first_output} requests are already queued "
                f"(--max-queued-requests {self.max_queued_requests})"
            )

    def check_fits_queue(self, request: GenerateRequest) -> None:
        """`check_fan_out` for a `GenerateRequest` (a malformed `n` counts as 1 here:
        `build_inputs` refuses it)."""
        samples = [_samples_asked(params) for params in request.sampling_params]
        n_param = request.sampling_param_names.get("n", "n")
        self.check_fan_out(samples, request.prompt_param, n_param)

    def check_fan_out(self, samples: Sequence[int], prompt_param: str, n_param: str) -> None:
        """A request whose prompts (`samples`: the `n` of each) fan out into more generations
        than --max-queued-requests can ever hold is a 400 naming the prompt field or `n`,
        checked before anything is tokenized (servers only: an offline Engine takes any
        batch)."""
        total = sum(samples)
        if total <= self.max_queued_requests:
            return
        if len(samples) > self.max_queued_requests or max(samples) == 1:
            param, what = prompt_param, f"{len(samples)} prompts"
        else:
            param = n_param
            what = f"{len(samples)} prompt(s) with {n_param} = {max(samples)}"
        raise InvalidParameterError(
            f"{what} make {total} generations, more than this server's queue can ever hold "
            f"(--max-queued-requests {self.max_queued_requests}): the request can never fit; "
            "split it into smaller ones",
            param,
        )

    async def generate(
        self, request: TokenizedGenerateReqInput, internal: bool = False
    ) -> AsyncIterator[GenerateChunk]:
        """Stream the request's chunks; leaving the iteration early aborts it in the scheduler.

        No admission check: that is `generate_many`'s job (probes and prefills skip it)."""
        async for chunk in self._run(self._register(request, internal=internal)):
            yield chunk

    def _register(
        self,
        request: TokenizedGenerateReqInput,
        param_names: Mapping[str, str] | None = None,
        internal: bool = False,
    ) -> _RequestState:
        """Track the request; from here on it counts as queued for admission control."""
        if request.rid in self._states:
            raise DuplicateRequestIdError(request.rid)
        params = request.sampling_params
        detokenizer = None
        if self.tokenizer is not None:
            detokenizer = IncrementalDetokenizer(
                self.tokenizer, request.input_ids, params.skip_special_tokens
            )
        state = _RequestState(
            input=request,
            outputs=asyncio.Queue(),
            detokenizer=detokenizer,
            trimmer=StopStringTrimmer(params.stop),
            internal=internal,
            param_names=param_names or {},
        )
        self._states[request.rid] = state
        return state

    async def _run(self, state: _RequestState) -> AsyncIterator[GenerateChunk]:
        request = state.input
        finished = False
        try:
            request.arrival_time = time.time()
            self._send(request)
            while not finished:
                output = await state.outputs.get()
                if isinstance(output, Exception):
                    finished = True
                    raise output
                finished = output.finished_reason is not None
                yield self._process_output(state, output)
        finally:
            self._states.pop(request.rid, None)
            if not finished and self._scheduler_error is None:
                self._count_finished(state, "abort", len(request.input_ids))
                with contextlib.suppress(SchedulerUnavailableError):
                    self._send(AbortReq(rid=request.rid))

    def _process_output(self, state: _RequestState, output: ReqOutput) -> GenerateChunk:
        now = time.perf_counter()
        reason = output.finished_reason
        internal = state.internal
        if not internal:
            self._record_latencies(state, output, now)
        state.got_first_output = True
        if reason is not None and reason["type"] == "abort":
            self._count_finished(state, "abort", output.prompt_tokens)
            raise RequestAbortedError("the request was aborted by the server")
        if reason is not None and reason["type"] == "error":
            self._count_finished(state, "error", output.prompt_tokens)
            if reason.get("param") is not None:  # refused before admission: the request's fault
                error = InvalidParameterError(
                    reason["message"], reason["param"], reason.get("code")
                )
                raise error.renamed(state.param_names)
            raise GenerationError(reason.get("message", "generation failed"))
        text = self._detokenize(state, output, final=reason is not None)
        logprobs = self._release_logprobs(state, output, final=reason is not None)
        if reason is not None:
            self._count_finished(state, reason["type"], output.prompt_tokens)
        return GenerateChunk(
            rid=state.input.rid,
            text=text,
            token_ids=list(output.new_token_ids),
            logprobs=logprobs,
            finish_reason=reason,
            prompt_tokens=output.prompt_tokens,
            completion_tokens=output.completion_tokens,
            cached_tokens=output.cached_tokens,
            pooled=output.pooled,
        )

    def _detokenize(self, state: _RequestState, output: ReqOutput, final: bool) -> str:
        if state.detokenizer is None:
            return ""
        # The stop token (EOS or one of stop_token_ids) ends the text without being part of
        # it, as OpenAI never returns the stop sequence; unskipped, EOS would show as text.
        num_text_ids = len(output.new_token_ids)
        matched = (output.finished_reason or {}).get("matched")
        if num_text_ids and isinstance(matched, int) and output.new_token_ids[-1] == matched:
            num_text_ids -= 1
        if not state.input.return_logprob:
            delta = state.detokenizer.feed(output.new_token_ids[:num_text_ids], final=final)
            return state.trimmer.push(delta, final=final)
        # Token by token, to know where each token's text starts (logprobs are cut with it).
        released = []
        last = len(output.new_token_ids) - 1
        for i, token_id in enumerate(output.new_token_ids):
            state.token_offsets.append(len(state.trimmer.text))
            ids = [token_id] if i < num_text_ids else []
            delta = state.detokenizer.feed(ids, final=final and i == last)
            released.append(state.trimmer.push(delta, final=final and i == last))
        if not output.new_token_ids and final:
            released.append(state.trimmer.push("", final=True))
        return "".join(released)

    def _release_logprobs(
        self, state: _RequestState, output: ReqOutput, final: bool
    ) -> list[TokenLogprob]:
        if not state.input.return_logprob or not output.logprobs:
            return []
        if state.detokenizer is None:
            return list(output.logprobs)
        state.pending_logprobs.extend(output.logprobs)
        first_index = len(state.token_offsets) - len(state.pending_logprobs)
        released: list[TokenLogprob] = []
        keep: list[TokenLogprob] = []
        for i, logprob in enumerate(state.pending_logprobs):
            offset = state.token_offsets[first_index + i]
            if state.trimmer.stopped and offset >= len(state.trimmer.text):
                continue  # the token belongs to the stop string or what followed it
            if offset < state.trimmer.released or final:
                released.append(logprob)
            else:
                keep.append(logprob)
        state.pending_logprobs = [] if final or state.trimmer.stopped else keep
        return released

    def _record_latencies(self, state: _RequestState, output: ReqOutput, now: float) -> None:
        metrics = self.metrics
        if output.queue_time is not None:
            metrics.queue_time.observe(output.queue_time)
        num_new = len(output.new_token_ids)
        if num_new:
            metrics.generation_tokens.inc(num_new)
            if state.last_token_time is None:
                metrics.time_to_first_token.observe(now - state.created)
                num_gaps = num_new - 1
            else:
                num_gaps = num_new
            if num_gaps and state.last_token_time is not None:
                gap = (now - state.last_token_time) / num_gaps
                for _ in range(num_gaps):
                    metrics.inter_token_latency.observe(gap)
            state.last_token_time = now
        if output.finished_reason is not None:
            metrics.e2e_request_latency.observe(now - state.created)

    def _count_finished(self, state: _RequestState, reason: str, prompt_tokens: int) -> None:
        if not state.internal:
            self.metrics.count_finished_request(reason, prompt_tokens)

    async def generate_many(
        self,
        requests: Sequence[TokenizedGenerateReqInput],
        enforce_queue_limit: bool = True,
        param_names: Mapping[str, str] | None = None,
    ) -> AsyncIterator[tuple[int, GenerateChunk]]:
        """Admit and run several requests at once, yielding (index, chunk) as chunks arrive.

        Admission and registration happen with no await in between, so requests arriving
        together cannot all slip past `--max-queued-requests` (offline batches, which may be
        larger than the queue limit on purpose, skip the check). `param_names`: how the request
        spells SamplingParams fields (`GenerateRequest.sampling_param_names`), for the
        scheduler's errors about them. Requests with the same prompt
        (`n > 1`) first prefill it once with `max_new_tokens=0`, so the copies find it in the
        radix cache instead of each computing it.
        """
        if enforce_queue_limit:
            self.check_capacity(len(requests))
        elif self._scheduler_error is not None:
            raise SchedulerUnavailableError(self._scheduler_error)
        rids = [r.rid for r in requests]
        for rid in rids:
            if rid in self._states or rids.count(rid) > 1:
                raise DuplicateRequestIdError(rid)
        states = [self._register(r, param_names) for r in requests]
        prompts = [tuple(r.input_ids) for r in requests]
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, state: _RequestState) -> None:
            try:
                async for chunk in self._run(state):
                    queue.put_nowait((index, chunk))
            except Exception as exc:
                queue.put_nowait((index, exc))

        tasks: list[asyncio.Future] = []
        try:
            prefill_cached: dict[tuple[int, ...], int] = {}
            for prompt in {p for p in prompts if prompts.count(p) > 1}:
                prefill_cached[prompt] = await self.prefill_only(requests[prompts.index(prompt)])
            tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(states)]
            remaining = len(requests)
            while remaining:
                index, item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                if item.finished:
                    remaining -= 1
                    cached = prefill_cached.get(prompts[index])
                    if cached is not None:
                        item.cached_tokens = cached
                yield index, item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for request in requests:  # never started (a failed prefill, an early cancel)
                self._states.pop(request.rid, None)

    async def prefill_only(self, request: TokenizedGenerateReqInput) -> int:
        """Put the prompt into the prefix cache; returns how many of its tokens were cached."""
        params = copy.copy(request.sampling_params)
        params.max_new_tokens = 0
        params.min_new_tokens = 0
        params.n = 1
        prefill = TokenizedGenerateReqInput(
            rid=uuid.uuid4().hex, input_ids=request.input_ids, sampling_params=params, stream=True
        )
        cached = 0
        async for chunk in self.generate(prefill, internal=True):
            cached = chunk.cached_tokens
        return cached

    # ---------------------------------------------------------------- control

    async def flush_cache(self) -> FlushCacheReqOutput:
        """Flush the prefix cache. The scheduler refuses while it has work; when no client
        request is in flight that work is only a finished step not yet retired, so the flush is
        retried for a moment instead of failing."""
        deadline = time.monotonic() + FLUSH_RETRY_S
        while True:
            reply = await self._flush_once()
            if reply.success or self.num_in_flight or time.monotonic() > deadline:
                return reply
            await asyncio.sleep(0.02)

    async def _flush_once(self) -> FlushCacheReqOutput:
        future = asyncio.get_running_loop().create_future()
        self._flush_replies.append(future)
        try:
            self._send(FlushCacheReq())
        except SchedulerUnavailableError:
            self._flush_replies.remove(future)
            raise
        return await future

    async def change_lora_adapter(self, name: str, path: str | None) -> LoRAAdapterReqOutput:
        """Load (`path`) or unload (None) a LoRA adapter in the scheduler; on success the
        adapters served are the scheduler's list."""
        req_id = uuid.uuid4().hex
        future = asyncio.get_running_loop().create_future()
        self._lora_replies[req_id] = future
        try:
            self._send(LoRAAdapterReq(name, path, req_id))
        except SchedulerUnavailableError:
            self._lora_replies.pop(req_id, None)
            raise
        reply: LoRAAdapterReqOutput = await future
        if reply.success:
            self.lora_adapters = dict(reply.adapters)
        return reply

    async def get_scheduler_info(self) -> dict[str, Any]:
        future = asyncio.get_running_loop().create_future()
        self._info_replies.append(future)
        try:
            self._send(GetServerInfoReq())
        except SchedulerUnavailableError:
            self._info_replies.remove(future)
            raise
        reply: GetServerInfoReqOutput = await future
        return reply.info

    async def abort_all(self) -> None:
        """Abort every in-flight request (end of a drain)."""
        for rid in list(self._states):
            with contextlib.suppress(SchedulerUnavailableError):
                self._send(AbortReq(rid=rid))

    # ---------------------------------------------------------------- text

    async def encode(
        self, text: str, add_special_tokens: bool = True, param: str | None = None
    ) -> list[int]:
        """Token ids of `text`, off the event loop when it is long; a text longer than any
        prompt that fits the context is refused without tokenizing it."""
        if self.tokenizer is None:
            raise InvalidParameterError(
                "this model has no tokenizer: send token ids instead of text", param
            )
        if (problem := surrogate_problem(text)) is not None:  # in-process callers: no body check
            raise InvalidParameterError(f"{param or 'the prompt'} {problem}", param)
        if len(text) > self.max_prompt_chars:
            raise PromptTooLongError(
                f"The prompt has {len(text)} characters: more than this model's maximum context "
                f"of {self.max_request_tokens} tokens can hold, whatever they tokenize to. "
                "Please shorten the prompt.",
                param or "prompt",
            )
        if len(text) <= INLINE_TOKENIZE_CHARS:
            return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        encode = functools.partial(self.tokenizer.encode, add_special_tokens=add_special_tokens)
        return await self.off_loop(encode, text)

    async def off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run text work (tokenizing, rendering a chat template) on the tokenizer's threads,
        so that a large input never holds the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._text_pool, fn, *args)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """The text of one token, as OpenAI logprobs show it (may be part of a character)."""
        if self.tokenizer is None:
            return f"<{token_id}>"
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


def max_prompt_chars(tokenizer: Tokenizer | None, max_request_tokens: int) -> int:
    """The most characters a prompt that fits `max_request_tokens` can have: each token
    stands for at most as many characters as the vocabulary's longest token (byte-level BPE
    never makes text shorter), with twice that for tokenizers whose normalizer drops
    characters. A longer prompt is refused untokenized: tokenizing 60 MB takes minutes of a
    core for a request that can never run."""
    if tokenizer is None:
        return 0
    vocab = tokenizer.get_vocab()
    longest = max((len(token) for token in vocab), default=1)
    return 2 * (longest + 1) * max_request_tokens


def _samples_asked(params: object) -> int:
    """The `n` one prompt's sampling params ask for (1 when unset or malformed)."""
    n = params.get("n") if isinstance(params, dict) else getattr(params, "n", 1)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def _is_token_id(value: object, vocab_size: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab_size


def _resolve_next(futures: deque[asyncio.Future], message: object) -> None:
    while futures:
        future = futures.popleft()
        if not future.done():
            future.set_result(message)
            return
    logger.warning("a %s arrived that nobody waits for", type(message).__name__)


# -------------------------------------------------------------------- tokenizer loading
