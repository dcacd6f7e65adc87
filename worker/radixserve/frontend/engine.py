"""The in-process Engine: a scheduler subprocess plus a TokenizerManager, callable from Python.

The HTTP server, the benchmarks and tests all go through this class. It starts the scheduler
process (which loads the weights) while this process loads only the tokenizer, then runs the
TokenizerManager on an asyncio loop: its own background thread by default, so plain synchronous
code can call `generate`, or the caller's loop (`event_loop_thread=False` + `await start()`), as
the aiohttp server does. Async methods called from another loop are bridged to the engine's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from radixserve.api_errors import InvalidParameterError
from radixserve.boundary import SCHEDULER_IMPORTED, PortArgs, run_scheduler_entry_point
from radixserve.catalog.checkpoint_files import (
    gguf_file,
    hf_directory_config,
    local_path,
    start_prefetch,
)
from radixserve.catalog.model_tasks import task_for_model
from radixserve.catalog.servable import check_servable
from radixserve.contract import check_server_args
from radixserve.frontend import native
from radixserve.frontend.tokenizer import load_frontend_tokenizer
from radixserve.frontend.tokenizer_manager import GenerateRequest, TokenizerManager
from radixserve.metrics.collectors import ServerMetrics
from radixserve.metrics.startup import StartupPhases
from radixserve.read_ahead import start_startup_read_ahead
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.server_args import BUILTIN_SMOLLM2, RANDOM_PREFIX, ServerArgs

logger = logging.getLogger(__name__)

# the end of a stream pumped across loops (Engine._pump)
_DONE = object()
SCHEDULER_STOP_TIMEOUT_S = 10.0
LOAD_PROGRESS_INTERVAL_S = 10.0


class EngineStartupError(RuntimeError):
    """The scheduler process could not load the model."""


@dataclasses.dataclass
class ModelInfo:
    """What the scheduler reported once the model was loaded."""

    max_total_tokens: int
    max_running_requests: int
    context_len: int
    vocab_size: int
    model_description: str
    device: str
    attention_backend: str
    # where the front end loads the tokenizer from (None: token ids only)
    tokenizer_dir: str | None = None
    # seconds per start-up phase in the scheduler process (metrics/startup.py)
    startup_phases: dict[str, float] = dataclasses.field(default_factory=dict)
    # what the model serves (catalog/model_tasks.ModelTask as a dict: task, pooling,
    # normalize, head) and its hidden size (the most `dimensions` an embedding can have)
    task: dict[str, Any] = dataclasses.field(default_factory=lambda: {"task": "generate"})
    hidden_size: int = 0
    # the LoRA adapters served from the start, name -> path (the scheduler's list: the
    # --lora-modules-file it read, less what it could not load)
    lora_adapters: dict[str, str] = dataclasses.field(default_factory=dict)


def check_model(server_args: ServerArgs) -> None:
    """Refuse, before any weights load, a checkpoint directory that cannot be served: an
    architecture or a quantization method the worker does not have (the error names it and
    lists what is supported). Checked on the raw config.json with neither torch nor
    transformers imported, while the scheduler process imports (it waits for this verdict).
    The other forms (a GGUF file, `random:`, the bundled model) carry their config inside
    what only the loader reads: the scheduler process checks those itself, with the same
    one-line error, before it loads any weights."""
    model = server_args.model
    if model == BUILTIN_SMOLLM2 or model.startswith(RANDOM_PREFIX):
        return
    config = hf_directory_config(model)
    if config is None:
        if gguf_file(local_path(model)) is None:
            raise EngineStartupError(
                f"cannot load model {model!r}: it names neither a checkpoint directory "
                "(config.json + *.safetensors), a .gguf file, a Hub repository, "
                f"{BUILTIN_SMOLLM2} nor {RANDOM_PREFIX}<preset>"
            )
        return
    try:
        check_servable(config, server_args.quantization)
        task_for_model(server_args.task, model, config)  # a --task the checkpoint cannot do
    except ValueError as exc:
        raise EngineStartupError(str(exc)) from None


def spawn_scheduler(
    server_args: ServerArgs,
) -> tuple[multiprocessing.process.BaseProcess, Any, Any]:
    """Start the scheduler process: (process, port args, the pipe to it). It is the first
    thing a start does, so that its imports overlap the front end's. Past its imports it says
    so on the pipe (SCHEDULER_IMPORTED) and waits for `approve_model` before it loads
    anything."""
    port_args = PortArgs.new()
    context = multiprocessing.get_context("spawn")
    parent_conn, child_conn = context.Pipe()
    process = context.Process(
        target=run_scheduler_entry_point,
        args=(server_args, port_args, child_conn),
        kwargs={"spawned_at": time.time()},
        name="radixserve-scheduler",
    )
    process.start()
    child_conn.close()
    return process, port_args, parent_conn


def approve_model(conn: Any) -> None:
    """Tell the waiting scheduler process that the model passed `check_model`: load it."""
    conn.send("load")


def wait_until_loaded(
    process: multiprocessing.process.BaseProcess,
    conn: Any,
    imported: threading.Event | None = None,
) -> ModelInfo:
    """Wait until the scheduler has loaded the model (setting `imported` when it says its
    imports are done); stop it if it fails or we are stopped."""
    started = time.perf_counter()
    try:
        while True:
            while not conn.poll(LOAD_PROGRESS_INTERVAL_S):
                logger.info("still loading the model (%.0fs)", time.perf_counter() - started)
            message = conn.recv()
            if message != SCHEDULER_IMPORTED:
                break
            if imported is not None:
                imported.set()
    except EOFError:
        process.join(timeout=SCHEDULER_STOP_TIMEOUT_S)
        raise EngineStartupError(
            f"the scheduler process exited while loading the model (exit code {process.exitcode})"
        ) from None
    except BaseException:  # SIGTERM or Ctrl-C while the model loads
        stop_process(process)
        raise
    finally:
        conn.close()
    if message.get("status") != "ready":
        stop_process(process)
        raise EngineStartupError(f"the scheduler failed to start: {message.get('message')}")
    fields = {f.name for f in dataclasses.fields(ModelInfo)}
    return ModelInfo(**{k: v for k, v in message.items() if k in fields})


def stop_process(process: multiprocessing.process.BaseProcess) -> None:
    """SIGTERM, then SIGKILL if it lingers; never leaves an orphan behind."""
    if process.is_alive():
        process.terminate()
        process.join(timeout=SCHEDULER_STOP_TIMEOUT_S)
    if process.is_alive():
        logger.warning("the scheduler ignored SIGTERM; killing it")
        process.kill()
        process.join()


class Engine:
    """Generate text with a scheduler subprocess; see the module docstring for threading.

    The scheduler is started with multiprocessing's "spawn", so a script that builds an Engine
    at import time must do so under `if __name__ == "__main__":`.
    """

    def __init__(
        self,
        server_args: ServerArgs | None = None,
        *,
        event_loop_thread: bool = True,
        enforce_queue_limit: bool = False,
        process_started_at: float | None = None,
        **kwargs: Any,
    ) -> None:
        if server_args is None:
            server_args = ServerArgs(**kwargs)
        elif kwargs:
            server_args = dataclasses.replace(server_args, **kwargs)
        check_server_args(server_args)
        self.server_args = server_args
        # Servers refuse work beyond --max-queued-requests; an offline batch is one caller
        # that wants all of its prompts run, so in-process use skips the limit by default.
        self.enforce_queue_limit = enforce_queue_limit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._closed = False
        started = time.perf_counter()
        # The scheduler process starts, and the pages its imports read at the last start
        # (torch's, triton's and CUDA's libraries, the bytecode: seconds of a cold node's
        # disk) are read ahead beside them. Once those are in memory, or its imports are done,
        # the disk is the weights': they are read ahead into the page cache, beside its model
        # setup and this process's model check and tokenizer (a read beside the imports'
        # page faults slows them several times). `process_started_at` (a server's start)
        # times what came before.
        imports_off_disk = threading.Event()
        self._process, port_args, scheduler_conn = spawn_scheduler(server_args)
        start_startup_read_ahead(done=imports_off_disk)
        start_prefetch(server_args.model, after=imports_off_disk)
        self.startup = StartupPhases()
        if process_started_at is not None:
            self.startup.add("launch", time.time() - process_started_at)
        try:
            check_model(server_args)
            approve_model(scheduler_conn)
            logger.info("loading %s in the scheduler process", server_args.model)
            self.model_info = wait_until_loaded(self._process, scheduler_conn, imports_off_disk)
            tokenizer = load_frontend_tokenizer(self.model_info.tokenizer_dir)
        except BaseException:
            stop_process(self._process)
            raise
        self.startup.update(self.model_info.startup_phases)
        # when the scheduler was up: what the front end adds after this is the "ready" phase
        self.scheduler_ready_at = time.perf_counter()
        logger.info(
            "loaded %s in %.1fs: %s on %s, attention %s, KV capacity %d tokens, "
            "context %d, up to %d running requests",
            server_args.model,
            time.perf_counter() - started,
            self.model_info.model_description,
            self.model_info.device,
            self.model_info.attention_backend,
            self.model_info.max_total_tokens,
            self.model_info.context_len,
            self.model_info.max_running_requests,
        )
        self.metrics = ServerMetrics(server_args.served_model_name or server_args.model)
        self.metrics.max_total_tokens.set(self.model_info.max_total_tokens)
        self.metrics.set_cache_config(
            server_args.kv_events_block_size, self.model_info.max_total_tokens
        )
        self.tokenizer_manager = TokenizerManager(
            tokenizer=tokenizer,
            scheduler_input_ipc_name=port_args.scheduler_input_ipc_name,
            tokenizer_ipc_name=port_args.tokenizer_ipc_name,
            scheduler_process=self._process,
            metrics=self.metrics,
            max_queued_requests=server_args.max_queued_requests,
            vocab_size=self.model_info.vocab_size,
            max_request_tokens=min(self.model_info.context_len, self.model_info.max_total_tokens),
        )
        self.tokenizer_manager.lora_adapters = dict(self.model_info.lora_adapters)
        if event_loop_thread:
            self._start_loop_thread()

    # ------------------------------------------------------------------ loop plumbing

    def _start_loop_thread(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=loop.run_forever, name="radixserve-engine-loop", daemon=True
        )
        self._loop_thread.start()
        self._loop = loop
        asyncio.run_coroutine_threadsafe(self.tokenizer_manager.start(), loop).result()

    async def start(self) -> None:
        """Attach the engine to the running loop (only with `event_loop_thread=False`)."""
        if self._loop is not None:
            raise RuntimeError("the engine already runs on an event loop")
        self._loop = asyncio.get_running_loop()
        await self.tokenizer_manager.start()

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the engine has no event loop: call `await engine.start()` first")
        return self._loop

    def _run_sync(self, coroutine: Any) -> Any:
        loop = self._require_loop()
        with contextlib.suppress(RuntimeError):
            if asyncio.get_running_loop() is loop:
                coroutine.close()
                raise RuntimeError("use the async methods from the engine's own event loop")
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    async def _on_engine_loop(self, coroutine: Any) -> Any:
        loop = self._require_loop()
        if asyncio.get_running_loop() is loop:
            return await coroutine
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, loop))

    def _pump(self, stream: AsyncIterator[Any], deliver: Callable[[Any], None]) -> Any:
        """Run `stream` on the engine's loop, handing each item, then the exception that ended
        it or `_DONE`, to `deliver` (called on the engine's loop): the one bridge from the
        engine's loop to a caller on another loop or thread. Returns the pump's future;
        cancelling it closes `stream` (an abort)."""

        async def pump() -> None:
            try:
                async with contextlib.aclosing(stream):
                    async for item in stream:
                        deliver(item)
            except Exception as exc:
                deliver(exc)
            deliver(_DONE)

        return asyncio.run_coroutine_threadsafe(pump(), self._require_loop())

    async def _stream_on_engine_loop(self, stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        loop = self._require_loop()
        if asyncio.get_running_loop() is loop:
            async with contextlib.aclosing(stream):
                async for item in stream:
                    yield item
            return
        caller_loop = asyncio.get_running_loop()
        items: asyncio.Queue = asyncio.Queue()
        future = self._pump(
            stream, lambda item: caller_loop.call_soon_threadsafe(items.put_nowait, item)
        )
        try:
            while (item := await items.get()) is not _DONE:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            future.cancel()

    # ------------------------------------------------------------------ requests
    #
    # Every call reduces to a `GenerateRequest` and runs through the TokenizerManager's front
    # door and stream (`native.py` shapes the results), as `POST /generate` does.

    def _select_adapter(self, request: GenerateRequest, lora_name: str | None) -> None:
        """Serve `request` with the LoRA adapter `lora_name` (None: the base model); a name the
        engine does not serve is refused here, listing those it does (the HTTP API's 404
        `model_not_found`)."""
        if lora_name is None:
            return
        served = self.tokenizer_manager.lora_adapters
        if lora_name not in served:
            raise InvalidParameterError(
                f"no LoRA adapter {lora_name!r} is served; adapters: {sorted(served)}",
                "lora_name",
            )
        request.lora_name = lora_name

    async def async_generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | SamplingParams | list | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        request_id: str | None = None,
        lora_name: str | None = None,
    ) -> dict | list[dict]:
        request, batched = GenerateRequest.native(
            prompt, input_ids, sampling_params, return_logprob, top_logprobs_num, request_id
        )
        self._select_adapter(request, lora_name)
        results = await self._on_engine_loop(
            native.generate(self.tokenizer_manager, request, self.enforce_queue_limit)
        )
        return results if batched or len(results) > 1 else results[0]

    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | SamplingParams | list | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        lora_name: str | None = None,
    ) -> dict | list[dict]:
        """Generate for one prompt (a dict back) or a batch (a list back), with `n` samples per
        prompt, with the LoRA adapter `lora_name` (a name served, as the HTTP API's `model`
        selects it; None: the base model). Each dict: {"text", "output_ids", "meta_info":
        {"id", "prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason",
        "e2e_latency", "time_to_first_token", "output_token_logprobs"?: [[logprob, token_id,
        top]]}}."""
        return self._run_sync(
            self.async_generate(
                prompt,
                sampling_params,
                input_ids,
                return_logprob,
                top_logprobs_num,
                lora_name=lora_name,
            )
        )

    async def async_generate_stream(
        self,
        prompt: str | None = None,
        sampling_params: dict | SamplingParams | None = None,
        input_ids: list[int] | None = None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        request_id: str | None = None,
        lora_name: str | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream one request: each dict carries the *new* text and output ids and the
        meta_info so far; the last one has a finish_reason."""
        request, _ = GenerateRequest.native(
            prompt, input_ids, sampling_params, return_logprob, top_logprobs_num, request_id
        )
        self._select_adapter(request, lora_name)
        stream = native.generate_stream(self.tokenizer_manager, request, self.enforce_queue_limit)
        async for item in self._stream_on_engine_loop(stream):
            yield item

    def generate_stream(
        self,
        prompt: str | None = None,
        sampling_params: dict | SamplingParams | None = None,
        input_ids: list[int] | None = None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        lora_name: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        """The synchronous form of `async_generate_stream`; closing it early aborts the request."""
        request, _ = GenerateRequest.native(
            prompt, input_ids, sampling_params, return_logprob, top_logprobs_num
        )
        self._select_adapter(request, lora_name)
        stream = native.generate_stream(self.tokenizer_manager, request, self.enforce_queue_limit)
        items: queue.Queue = queue.Queue()
        future = self._pump(stream, items.put)
        try:
            while (item := items.get()) is not _DONE:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            future.cancel()

    # ------------------------------------------------------------------ control

    async def async_get_server_info(self) -> dict[str, Any]:
        scheduler_info = await self._on_engine_loop(self.tokenizer_manager.get_scheduler_info())
        return {
            **self.server_args.public_dict(),
            **dataclasses.asdict(self.model_info),
            "num_in_flight_requests": self.tokenizer_manager.num_in_flight,
            "scheduler": scheduler_info,
            **scheduler_info,
        }

    def get_server_info(self) -> dict[str, Any]:
        """Server args, model info, and the scheduler's counters (at the top level too)."""
        return self._run_sync(self.async_get_server_info())

    async def async_flush_cache(self) -> bool:
        reply = await self._on_engine_loop(self.tokenizer_manager.flush_cache())
        if not reply.success:
            logger.info("flush_cache refused: %s", reply.message)
        return reply.success

    def flush_cache(self) -> bool:
        return self._run_sync(self.async_flush_cache())

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Serve the LoRA adapter at `path` as `name` (what `POST /v1/load_lora_adapter`
        does); InvalidParameterError with the scheduler's reason when it cannot be served."""
        self._change_lora_adapter(name, path, "lora_path")

    def unload_lora_adapter(self, name: str) -> None:
        """Stop serving `name` (`POST /v1/unload_lora_adapter`); InvalidParameterError when
        it is not served."""
        self._change_lora_adapter(name, None, "lora_name")

    def _change_lora_adapter(self, name: str, path: str | None, param: str) -> None:
        change = self.tokenizer_manager.change_lora_adapter(name, path)
        reply = self._run_sync(self._on_engine_loop(change))
        if not reply.success:
            raise InvalidParameterError(reply.message, param)

    def get_model_info(self) -> dict[str, Any]:
        tokenizer = self.tokenizer_manager.tokenizer
        return {
            "model_path": self.server_args.model,
            "served_model_name": self.server_args.served_model_name,
            "tokenizer_path": getattr(tokenizer, "name_or_path", None),
            "is_generation": True,
            **dataclasses.asdict(self.model_info),
        }

    # ------------------------------------------------------------------ shutdown

    async def async_shutdown(self) -> None:
        """Close the TokenizerManager (on the engine's loop) and stop the scheduler."""
        if self._closed:
            return
        self._closed = True
        if self._loop is not None:
            await self._on_engine_loop(self.tokenizer_manager.close())
        stop_process(self._process)

    def shutdown(self) -> None:
        if self._closed:
            return
        if self._loop_thread is not None and self._loop is not None:
            asyncio.run_coroutine_threadsafe(self.async_shutdown(), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join()
            self._loop.close()
        else:
            self._closed = True
            stop_process(self._process)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()
