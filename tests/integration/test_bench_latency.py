"""bench latency's static-batch loop on the CPU (the GPU runs add ceilings and overlap): it
decodes every request to its length and gives back every KV slot and request row."""

from __future__ import annotations

from radixserve.entrypoints.bench_latency import run_batch
from radixserve.managers.tp_worker import ModelWorker
from radixserve.mem_cache.chunk_cache import ChunkCache
from radixserve.model_loader.loader import load_model_source
from radixserve.server_args import ServerArgs


def test_run_batch_decodes_and_frees_everything():
    args = ServerArgs(
        model="random:tiny-llama", device="cpu", max_total_tokens=2048, max_running_requests=8
    )
    source = load_model_source(args.model, dtype="float32", device="cpu")
    worker = ModelWorker(args, source)
    runner = worker.model_runner
    cache = ChunkCache(runner.req_to_token_pool, runner.allocator)
    free_slots = runner.allocator.available_size()
    free_rows = runner.req_to_token_pool.available_size()
    for bs in (1, 3):
        result = run_batch(worker, cache, bs, 12, 6, source.config.vocab_size)
        assert result["bs"] == bs and result["overlap"] is False
        assert result["prefill_s"] > 0 and result["decode_step_s"] > 0
        assert result["decode_device_step_s"] is None  # no device timeline on the CPU
        assert runner.allocator.available_size() == free_slots
        assert runner.req_to_token_pool.available_size() == free_rows
