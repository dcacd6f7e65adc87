"""The native API's shapes: `POST /generate` and the Engine's generate methods. One prompt or
a batch, as text or token ids, in; a result dict per (prompt, sample) out, whole or streamed.

Both go through the TokenizerManager's front door (`build_inputs`) and its one stream
(`generate_many`), as the OpenAI endpoints do; this module only shapes what comes back.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from radixserve.api_errors import InvalidParameterError
from radixserve.boundary import TokenizedGenerateReqInput, TokenLogprob
from radixserve.frontend.tokenizer_manager import (
    GenerateChunk,
    GenerateRequest,
    TokenizerManager,
)


async def generate(
    tm: TokenizerManager, request: GenerateRequest, enforce_queue_limit: bool = True
) -> list[dict[str, Any]]:
    """Run every (prompt, sample) of `request` to completion: one result dict each, in order."""
    inputs = await tm.build_inputs(request)
    results = [NativeResult(i) for i in inputs]
    stream = tm.generate_many(inputs, enforce_queue_limit, request.sampling_param_names)
    async for index, chunk in stream:
        results[index].add(chunk)
    return [r.result() for r in results]


async def generate_stream(
    tm: TokenizerManager, request: GenerateRequest, enforce_queue_limit: bool = True
) -> AsyncIterator[dict[str, Any]]:
    """Stream one request: each dict carries the *new* text and output ids and the meta_info
    so far; the last one has a finish_reason."""
    inputs = await tm.build_inputs(request)
    if len(inputs) > 1:
        raise InvalidParameterError("streaming takes one prompt with n = 1", "stream")
    builder = NativeResult(inputs[0])
    stream = tm.generate_many(inputs, enforce_queue_limit, request.sampling_param_names)
    async for _, chunk in stream:
        yield builder.stream_item(chunk)


class NativeResult:
    """Accumulates one request's chunks into the native result dict."""

    def __init__(self, request: TokenizedGenerateReqInput) -> None:
        self.request = request
        self.started = time.perf_counter()
        self.text_parts: list[str] = []
        self.output_ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.last: GenerateChunk | None = None
        self.first_token_latency: float | None = None

    def _note_first_token(self, chunk: GenerateChunk) -> None:
        if chunk.token_ids and self.first_token_latency is None:
            self.first_token_latency = time.perf_counter() - self.started

    def add(self, chunk: GenerateChunk) -> None:
        self._note_first_token(chunk)
        self.text_parts.append(chunk.text)
        self.output_ids.extend(chunk.token_ids)
        self.logprobs.extend(chunk.logprobs)
        self.last = chunk

    def meta_info(self, logprobs: list[TokenLogprob]) -> dict[str, Any]:
        chunk = self.last
        assert chunk is not None
        meta: dict[str, Any] = {
            "id": self.request.rid,
            "prompt_tokens": chunk.prompt_tokens,
            "completion_tokens": chunk.completion_tokens,
            "cached_tokens": chunk.cached_tokens,
            "finish_reason": chunk.finish_reason,
            "e2e_latency": time.perf_counter() - self.started,
            "time_to_first_token": self.first_token_latency,
        }
        if self.request.return_logprob:
            meta["output_token_logprobs"] = [
                [entry.logprob, entry.token_id, [list(t) for t in entry.top]] for entry in logprobs
            ]
        return meta

    def result(self) -> dict[str, Any]:
        return {
            "text": "".join(self.text_parts),
            "output_ids": self.output_ids,
            "meta_info": self.meta_info(self.logprobs),
        }

    def stream_item(self, chunk: GenerateChunk) -> dict[str, Any]:
        self._note_first_token(chunk)
        self.last = chunk
        return {
            "text": chunk.text,
            "output_ids": chunk.token_ids,
            "meta_info": self.meta_info(chunk.logprobs),
        }
