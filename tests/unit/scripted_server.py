"""The HTTP front end over a scripted model, for tests that drive it with the official
`openai` client.

Everything but the model is real: the aiohttp app and its middlewares, the OpenAI protocol,
the bundled SmolLM2 tokenizer and chat template, the native API's path and the front door
(`build_inputs`), and the tool-call and reasoning parsers. The scripted TokenizerManager
answers each request with the next scripted output, in small chunks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
from aiohttp.test_utils import TestServer

from radixserve.boundary import FlushCacheReqOutput, TokenizedGenerateReqInput
from radixserve.frontend.engine import Engine, ModelInfo
from radixserve.frontend.http_server import ServerState, build_app
from radixserve.frontend.tokenizer_manager import GenerateChunk, TokenizerManager
from radixserve.metrics.collectors import ServerMetrics
from radixserve.server_args import BUILTIN_SMOLLM2, ServerArgs

MODEL = "smollm2-135m"


@dataclass(frozen=True)
class Scripted:
    """A scripted output and how it ends: `finish` "stop" (EOS) or "length" (cut at
    max_tokens). A plain string in a script ends with EOS."""

    text: str
    finish: str = "stop"


class ScriptedTokenizerManager(TokenizerManager):
    """The real front door over a scripted model: request k gets script[k], 3 characters a
    chunk, ending with EOS (or as its `Scripted` says)."""

    def __init__(self, tokenizer: Any, script: Sequence[str | Scripted]) -> None:
        super().__init__(
            tokenizer=tokenizer,
            scheduler_input_ipc_name="ipc://unused",
            tokenizer_ipc_name="ipc://unused",
            scheduler_process=None,  # type: ignore[arg-type]
            metrics=ServerMetrics(MODEL),
            max_queued_requests=16,
            vocab_size=len(tokenizer),
            max_request_tokens=4096,
        )
        self.script = list(script)
        self.seen: list[TokenizedGenerateReqInput] = []

    @property
    def scheduler_alive(self) -> bool:
        return True

    async def generate_many(
        self,
        requests: Sequence[TokenizedGenerateReqInput],
        enforce_queue_limit: bool = True,
        param_names: Any = None,
    ) -> AsyncIterator[tuple[int, GenerateChunk]]:
        for index, request in enumerate(requests):
            self.seen.append(request)
            item = self.script.pop(0)
            if not isinstance(item, Scripted):
                item = Scripted(item)
            text = item.text
            stop = {"type": "stop", "matched": 2}
            reason = {"type": "length"} if item.finish == "length" else stop
            pieces = [text[i : i + 3] for i in range(0, len(text), 3)] or [""]
            for k, piece in enumerate(pieces):
                last = k == len(pieces) - 1
                yield (
                    index,
                    GenerateChunk(
                        rid=request.rid,
                        text=piece,
                        token_ids=[100 + k],
                        logprobs=[],
                        finish_reason=reason if last else None,
                        prompt_tokens=len(request.input_ids),
                        completion_tokens=k + 1,
                        cached_tokens=0,
                    ),
                )

    async def start(self) -> None:
        """Nothing to connect to."""

    async def flush_cache(self) -> FlushCacheReqOutput:
        return FlushCacheReqOutput(success=True)

    async def get_scheduler_info(self) -> dict[str, Any]:
        return {}

    def prompt_text(self, k: int) -> str:
        return self.tokenizer.decode(self.seen[k].input_ids, skip_special_tokens=False)


def scripted_engine(tokenizer: Any, script: Sequence[str | Scripted], **server_args: Any) -> Engine:
    """The real Engine's request path (the native API included) with no scheduler process."""
    engine = Engine.__new__(Engine)
    engine.server_args = ServerArgs(model=BUILTIN_SMOLLM2, **server_args)
    engine.tokenizer_manager = ScriptedTokenizerManager(tokenizer, script)
    engine.model_info = ModelInfo(4096, 16, 2048, len(tokenizer), "scripted", "cpu", "none")
    engine.metrics = engine.tokenizer_manager.metrics
    engine.enforce_queue_limit = True
    engine._loop = None
    return engine


def serve(
    tokenizer,
    script: Sequence[str | Scripted],
    test,
    client_key: str = "unused",
    **server_args: Any,
):
    """Run `test(client, session, engine)` against the app, on one event loop."""
    engine = scripted_engine(tokenizer, script, **server_args)

    async def main():
        await engine.start()
        server = TestServer(build_app(engine, ServerState()))
        await server.start_server()
        base_url = str(server.make_url(""))
        try:
            async with (
                openai.AsyncOpenAI(
                    base_url=base_url + "/v1", api_key=client_key, max_retries=0
                ) as client,
                aiohttp.ClientSession(base_url=base_url) as session,
            ):
                await test(client, session, engine.tokenizer_manager)
        finally:
            await server.close()

    asyncio.run(main())
    return engine.tokenizer_manager
