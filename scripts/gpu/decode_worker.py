"""The decode step the GPU scripts inspect: a model worker on the GPU with its CUDA graphs
captured up to a batch size (decode_timeline.py, step_tiles.py, profile_decode.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixserve.mem_cache.chunk_cache import ChunkCache
from radixserve.model_loader.loader import load_model_source_for
from radixserve.scheduler.tp_worker import ModelWorker
from radixserve.server_args import ServerArgs


@dataclass
class DecodeWorker:
    worker: ModelWorker
    runner: Any  # the worker's ModelRunner
    cache: ChunkCache
    vocab: int


def decode_worker(
    model: str,
    quantization: str | None = None,
    backend: str = "triton",
    max_bs: int = 1,
) -> DecodeWorker:
    """`model` (e.g. random:llama-3-8b) loaded on the GPU, its decode graphs captured for batch
    sizes up to `max_bs`; `bench_latency.run_batch(d.worker, d.cache, bs, ...)` then runs
    passes (and fills the graphs' inputs)."""
    args = ServerArgs(
        model=model,
        context_length=4096,
        attention_backend=backend,
        max_running_requests=max(max_bs, 8),
        cuda_graph_max_bs=max_bs,
        quantization=quantization,
    )
    source = load_model_source_for(args)
    worker = ModelWorker(args, source)
    runner = worker.model_runner
    cache = ChunkCache(runner.req_to_token_pool, runner.allocator)
    return DecodeWorker(worker, runner, cache, source.config.vocab_size)
