"""The batch-1 decode step the GPU scripts inspect: a model worker with the triton backend and
the batch-1 CUDA graph only (decode_timeline.py, step_tiles.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixserve.managers.tp_worker import ModelWorker
from radixserve.mem_cache.chunk_cache import ChunkCache
from radixserve.model_loader.loader import load_model_source_for
from radixserve.server_args import ServerArgs


@dataclass
class Batch1Worker:
    worker: ModelWorker
    runner: Any  # the worker's ModelRunner
    cache: ChunkCache
    vocab: int


def batch1_worker(model: str, quantization: str | None) -> Batch1Worker:
    """`model` (e.g. random:llama-3-8b) loaded on the GPU, its batch-1 decode graph captured;
    `bench_latency.run_batch(b.worker, b.cache, 1, ...)` then fills the graph's inputs."""
    args = ServerArgs(
        model=model,
        context_length=4096,
        attention_backend="triton",
        max_running_requests=8,
        cuda_graph_max_bs=1,
        quantization=quantization,
    )
    source = load_model_source_for(args)
    worker = ModelWorker(args, source)
    runner = worker.model_runner
    cache = ChunkCache(runner.req_to_token_pool, runner.allocator)
    return Batch1Worker(worker, runner, cache, source.config.vocab_size)
