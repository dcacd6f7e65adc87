"""Where the host's time goes in a decode step, on the GPU machine.

(a) bench latency's batch-1 decode loop (`run_batch`), under cProfile: the functions that cost
the host time per step. With overlap the step can be no shorter than the host's work for it.
(b) the scheduler in-process (no sockets; each step's outputs are pickled as the process would
send them) decoding 64 requests: host time per step against the device's decode step, the idle
between consecutive decode steps, then the same under cProfile.

Usage: python3 scripts/gpu/profile_host.py MODEL  (e.g. random:llama-3.2-1b)
"""

import cProfile
import pickle
import pstats
import random
import sys
import time

import torch

from radixserve.bench.latency import run_batch
from radixserve.boundary import BatchReqOutput, TokenizedGenerateReqInput
from radixserve.mem_cache.chunk_cache import ChunkCache
from radixserve.model_loader.loader import load_model_source
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.scheduler.scheduler_process import build_scheduler
from radixserve.server_args import ServerArgs

model = sys.argv[1] if len(sys.argv) > 1 else "random:llama-3.2-1b"
source = load_model_source(model, dtype="auto", device="cuda", context_length=4096)
args = ServerArgs(
    model=model, context_length=4096, attention_backend="triton", cuda_graph_max_bs=64
)
scheduler = build_scheduler(args, source)
worker, runner = scheduler.worker, scheduler.worker.model_runner
vocab = source.config.vocab_size


def show(profiler: cProfile.Profile, title: str, steps: int) -> None:
    print(f"\n=== {title}: cProfile, {steps} steps (times are totals; divide by steps)")
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(28)


# (a) batch-1 decode as bench latency runs it
cache = ChunkCache(runner.req_to_token_pool, runner.allocator)
run_batch(worker, cache, 1, 128, 16, vocab)
plain = run_batch(worker, cache, 1, 512, 129, vocab)
print(
    f"=== bs 1 run_batch: step {plain['decode_step_s'] * 1e3:.3f} ms, "
    f"device {(plain['decode_device_step_s'] or 0) * 1e3:.3f} ms"
)
profiler = cProfile.Profile()
profiler.enable()
run_batch(worker, cache, 1, 512, 129, vocab)
profiler.disable()
show(profiler, "bs 1 run_batch", 128)


# (b) the scheduler's loop at 64 running requests
def serve(n: int, output_len: int, profiler: cProfile.Profile | None) -> None:
    rng = random.Random(n)
    params = SamplingParams(max_new_tokens=output_len, temperature=0.0, ignore_eos=True)
    for i in range(n):
        ids = [rng.randrange(10, vocab) for _ in range(64)]
        scheduler.dispatch(TokenizedGenerateReqInput(f"r{i}-{time.time()}", ids, params))
    host_s, steps = [], 0
    timeline = worker.timeline
    busy0, gap0 = timeline.decode_busy_ms, timeline.decode_gap_ms
    if profiler is not None:
        profiler.enable()
    while scheduler.has_work():
        start = time.perf_counter()
        scheduler.step()
        pickle.dumps(BatchReqOutput(scheduler.pop_outputs(), scheduler.pop_stats()))
        host_s.append(time.perf_counter() - start)
        steps += 1
    if profiler is not None:
        profiler.disable()
    busy = timeline.decode_busy_ms - busy0
    gap = timeline.decode_gap_ms - gap0
    mid = sorted(host_s[len(host_s) // 4 : -len(host_s) // 4])
    print(
        f"=== scheduler, {n} requests x {output_len} tokens{' (cProfile)' if profiler else ''}: "
        f"{steps} steps, host per step median {1e3 * mid[len(mid) // 2]:.3f} ms, "
        f"device decode step {busy / max(steps - 2, 1):.3f} ms, "
        f"idle between decode steps {100 * gap / max(busy + gap, 1e-9):.2f}%"
    )


serve(64, 32, None)  # warm-up
serve(64, 256, None)
profiler = cProfile.Profile()
serve(64, 256, profiler)
show(profiler, "scheduler at 64 requests", 256)
torch.cuda.synchronize()
