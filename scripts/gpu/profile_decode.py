"""Where a batch-1 decode step's time goes: torch.profiler over a few steps of bench latency's
loop (CPU ops by self time, and device kernel time)."""

import sys

from torch.profiler import ProfilerActivity, profile

from radixserve.entrypoints.bench_latency import run_batch
from radixserve.managers.tp_worker import ModelWorker
from radixserve.mem_cache.chunk_cache import ChunkCache
from radixserve.model_loader.loader import load_model_source
from radixserve.server_args import ServerArgs

model = sys.argv[1] if len(sys.argv) > 1 else "random:llama-3.2-1b"
args = ServerArgs(
    model=model, context_length=4096, attention_backend="triton", max_running_requests=8
)
source = load_model_source(model, dtype="auto", device="cuda", context_length=4096)
worker = ModelWorker(args, source)
cache = ChunkCache(worker.model_runner.req_to_token_pool, worker.model_runner.allocator)
run_batch(worker, cache, 1, 128, 16, source.config.vocab_size)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    print(run_batch(worker, cache, 1, 128, 16, source.config.vocab_size))
print(
    prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60)
)
print(
    prof.key_averages().table(
        sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60
    )
)
