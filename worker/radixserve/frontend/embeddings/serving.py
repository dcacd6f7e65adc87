"""The pooling endpoints (`/v1/embeddings`, `/v1/rerank`, `/v1/score`) over the
TokenizerManager's front door, independent of the HTTP server.

Texts are tokenized first, all of a request's in one batch call on the tokenizer's threads
(`_encode`). Each input is then one prefill-only request (`max_new_tokens` 0, `PoolingParams`
set) built by the same `build_inputs` as every generation endpoint (token-id and length checks,
request ids), run by `generate_many` (admission, the queue bound, aborts), and answered by the
scheduler with its pooled vector or score (`GenerateChunk.pooled`).

A rerank's documents share its query: the first document runs alone, so that the query's KV
is in the radix cache when the others are admitted and each of them computes only its own
tokens (their prefix match finds it).
"""

from __future__ import annotations

import array
import asyncio
import base64
import contextlib
import functools
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from radixserve.api_errors import APIError, InvalidParameterError
from radixserve.boundary import PoolingParams, TokenizedGenerateReqInput
from radixserve.frontend.embeddings.protocol import EmbeddingRequest, RerankRequest, ScoreRequest
from radixserve.frontend.embeddings.rerank_prompt import yes_no_prompt
from radixserve.frontend.openai.protocol import FieldPolicy, parse_request
from radixserve.frontend.openai.serving import ChunkObserver
from radixserve.frontend.tokenizer_manager import (
    GenerateRequest,
    PromptTooLongError,
    TokenizerManager,
)

# what each task's endpoints are, for the 400 that names the right ones
TASK_ENDPOINTS = {
    "generate": "/v1/completions, /v1/chat/completions, /v1/responses, /v1/messages, /generate",
    "embed": "/v1/embeddings",
    "rerank": "/v1/rerank, /v1/score",
}


def wrong_task_error(task: str, asked: str) -> APIError:
    """A 400 for an endpoint of another task than the model's (`asked`)."""
    what = {"generate": "generates text", "embed": "embeds text", "rerank": "scores pairs"}
    return APIError(
        f"this server's model {what[task]} (--task {task}): use {TASK_ENDPOINTS[task]}; it "
        f"does not serve --task {asked}",
        status=400,
        param="model",
        code="unsupported_task",
    )


class PoolingServing:
    """Embeddings, rerank and score for a model started with `--task embed|rerank`."""

    def __init__(
        self,
        tm: TokenizerManager,
        policy: FieldPolicy,
        model_name: str,
        task: dict[str, Any],
        hidden_size: int,
        check_model: Callable[[str], None],
    ) -> None:
        self.tm = tm
        self.check_model = check_model
        self.policy = policy
        self.model_name = model_name
        self.task = task["task"]
        self.head = task.get("head", "none")
        self.hidden_size = hidden_size

    def _check_model(self, model: str | None) -> None:
        """A 404 for a model this server does not serve (`model` may be left out)."""
        if model is not None:
            self.check_model(model)

    def require(self, task: str) -> None:
        """A 400 unless the model serves `task`."""
        if self.task != task:
            raise wrong_task_error(self.task, task)

    # ------------------------------------------------------------------ embeddings

    async def embeddings(
        self, body: Any, request_id: str, observe: ChunkObserver | None = None
    ) -> str:
        """The reply as JSON text: a large batch is megabytes of floats, encoded on a thread
        one embedding at a time (one `json.dumps` of all of them would hold the GIL, and so
        the event loop, for a second or more)."""
        request: EmbeddingRequest = parse_request(EmbeddingRequest, body, self.policy)
        self._check_model(request.model)
        dims = request.dimensions
        if dims is not None and dims > self.hidden_size:
            raise InvalidParameterError(
                f"dimensions must be in [1, {self.hidden_size}] (the model's embedding size), "
                f"got {dims}",
                "dimensions",
            )
        prompts = request.inputs()
        if isinstance(prompts[0], str):
            where = "input" if isinstance(request.input, str) else "input.{}"
            prompts = [*await self._encode(prompts, where)]  # type: ignore[arg-type]
        pooled, prompt_tokens = await self._run(prompts, "input", request_id, dims, observe)
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
        return await asyncio.to_thread(
            _embeddings_json, pooled, request.encoding_format, self.model_name, usage
        )

    # ------------------------------------------------------------------ rerank and score

    async def rerank(
        self, body: Any, request_id: str, observe: ChunkObserver | None = None
    ) -> dict[str, Any]:
        request: RerankRequest = parse_request(RerankRequest, body, self.policy)
        self._check_model(request.model)
        documents = request.texts()
        scores, tokens = await self._scores(
            [request.query], documents, "documents", request_id, request.instruction, observe
        )
        order = sorted(range(len(documents)), key=lambda i: -scores[i])
        if request.top_n is not None:
            order = order[: request.top_n]
        results = []
        for i in order:
            result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
            if request.return_documents:
                result["document"] = {"text": documents[i]}
            results.append(result)
        return {
            "id": f"rerank-{request_id}",
            "model": self.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "results": results,
        }

    async def score(
        self, body: Any, request_id: str, observe: ChunkObserver | None = None
    ) -> dict[str, Any]:
        request: ScoreRequest = parse_request(ScoreRequest, body, self.policy)
        self._check_model(request.model)
        firsts, seconds = request.pairs_of()
        scores, tokens = await self._scores(firsts, seconds, "text_2", request_id, None, observe)
        return {
            "id": f"score-{request_id}",
            "object": "list",
            "created": int(time.time()),
            "model": self.model_name,
            "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    async def _scores(
        self,
        queries: list[str],
        documents: list[str],
        param: str,
        request_id: str,
        instruction: str | None,
        observe: ChunkObserver | None,
    ) -> tuple[list[float], int]:
        """The score of each (query, document) pair (one query for all, or one each): the
        reranker's instruction template around them for a model scored by its "yes"/"no"
        tokens (rerank_prompt.py), the tokenizer's own pair encoding for a classifier (as
        sentence-transformers' CrossEncoder feeds it)."""
        firsts = [queries[0] if len(queries) == 1 else queries[i] for i in range(len(documents))]
        for i, (query, document) in enumerate(zip(firsts, documents, strict=True)):
            if len(query) + len(document) > self.tm.max_prompt_chars:
                raise PromptTooLongError(
                    f"a query and document of {len(query) + len(document)} characters cannot "
                    f"fit this model's context of {self.tm.max_request_tokens} tokens",
                    f"{param}.{i}",
                )
        if self.head == "yes_no":
            parts = [
                yes_no_prompt(q, d, instruction) for q, d in zip(firsts, documents, strict=True)
            ]
            unique = list(dict.fromkeys(head for head, _ in parts))  # one query: one head
            heads = dict(zip(unique, await self._encode(unique, param, special=False), strict=True))
            tails = await self._encode([tail for _, tail in parts], param, special=False)
            prompts: list[str | list[int]] = [
                heads[head] + tail for (head, _), tail in zip(parts, tails, strict=True)
            ]
        else:
            prompts = [*await self._encode(firsts, param, pairs=documents)]
        pooled, tokens = await self._run(prompts, param, request_id, None, observe)
        return [array.array("f", raw)[0] for raw in pooled], tokens

    async def _encode(
        self,
        texts: list[str],
        param: str,
        special: bool = True,
        pairs: list[str] | None = None,
    ) -> list[list[int]]:
        """Token ids of many texts (or text pairs) in one call on the tokenizer's threads: the
        Rust tokenizer encodes a batch in parallel without the GIL, so thousands of inputs
        never hold the event loop. A text longer than any prompt that fits is refused first,
        untokenized; `param` may hold `{}` for the text's index."""
        tokenizer = self.tm.tokenizer
        if tokenizer is None:
            raise InvalidParameterError(
                "this model has no tokenizer: send token ids", param.format(0)
            )
        for i, text in enumerate(texts):
            if len(text) > self.tm.max_prompt_chars:
                raise PromptTooLongError(
                    f"{param.format(i)} has {len(text)} characters: more than this model's "
                    f"context of {self.tm.max_request_tokens} tokens can hold",
                    param.format(i),
                )
        encode = functools.partial(tokenizer, add_special_tokens=special)
        encoded = await self.tm.off_loop(encode, texts, pairs)
        return [list(ids) for ids in encoded["input_ids"]]

    # ------------------------------------------------------------------ running

    async def _run(
        self,
        prompts: list[str | list[int]],
        param: str,
        request_id: str,
        dims: int | None,
        observe: ChunkObserver | None,
    ) -> tuple[list[bytes], int]:
        """Pool every prompt: (their outputs in order, float32 bytes; the prompt tokens they
        took). `observe` (a request log's) sees each finished input."""
        self.tm.check_fan_out([1] * len(prompts), param, param)
        generate = GenerateRequest(
            prompts=prompts,
            sampling_params=[{"max_new_tokens": 0}] * len(prompts),
            request_id=request_id or uuid.uuid4().hex,
            prompt_param=param,
        )
        inputs = await self.tm.build_inputs(generate)
        for item in inputs:
            item.pooling = PoolingParams(dimensions=dims)
        pooled: list[bytes | None] = [None] * len(inputs)
        tokens = 0
        # a rerank's first pair alone, the rest once its prefix (the query) is cached
        waves = [inputs[:1], inputs[1:]] if self.task == "rerank" else [inputs]
        offset = 0
        for wave in waves:
            if wave:
                tokens += await self._collect(wave, pooled, offset, observe)
            offset += len(wave)
        return [raw or b"" for raw in pooled], tokens

    async def _collect(
        self,
        inputs: list[TokenizedGenerateReqInput],
        pooled: list[bytes | None],
        offset: int,
        observe: ChunkObserver | None,
    ) -> int:
        tokens = 0
        stream = self.tm.generate_many(inputs)
        async with contextlib.aclosing(stream):
            async for index, chunk in stream:
                if observe is not None:
                    observe(offset + index, chunk)
                if chunk.finished:
                    pooled[offset + index] = chunk.pooled
                    tokens += chunk.prompt_tokens
        return tokens


def _embeddings_json(
    pooled: list[bytes], encoding_format: str, model: str, usage: dict[str, int]
) -> str:
    """OpenAI's embeddings reply, `{"object": "list", "data": [...], "model", "usage"}`."""
    data = ", ".join(
        json.dumps({"object": "embedding", "index": i, "embedding": _encode(raw, encoding_format)})
        for i, raw in enumerate(pooled)
    )
    rest = json.dumps({"model": model, "usage": usage})[1:]
    return f'{{"object": "list", "data": [{data}], {rest}'


def _encode(raw: bytes, encoding_format: str) -> list[float] | str:
    """OpenAI's encodings: floats, or base64 of the float32 little-endian bytes (what the
    scheduler sends: ReqOutput.pooled)."""
    if encoding_format == "base64":
        return base64.b64encode(raw).decode("ascii")
    return array.array("f", raw).tolist()
