"""Where a decode step's time goes, per batch size: the whole step as bench latency runs it (host
and device, no overlap), the device time of the captured graph alone (replayed back to back),
the kernels by device time, and every host sync the step makes.

Usage: python3 scripts/gpu/profile_decode.py MODEL BS[,BS...]  (e.g. random:llama-3.2-1b 1,64,256)
"""

import sys
import traceback
import warnings

import torch
from decode_worker import decode_worker
from torch.profiler import ProfilerActivity, profile

from radixserve.bench.latency import run_batch

model = sys.argv[1] if len(sys.argv) > 1 else "random:llama-3.2-1b"
sizes = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "1").split(",")]
backend = sys.argv[3] if len(sys.argv) > 3 else "triton"
decode = decode_worker(model, backend=backend, max_bs=max(sizes))
worker, runner, cache, vocab = decode.worker, decode.runner, decode.cache, decode.vocab
run_batch(worker, cache, 1, 128, 8, vocab)

for bs in sizes:
    steps = 16
    wall = run_batch(worker, cache, bs, 512, steps, vocab)["decode_step_s"]
    graphs = runner.cuda_graph_runner
    replay_ms = float("nan")
    if graphs is not None:
        padded = next(s for s in graphs.capture_bs if s >= bs)
        graph = graphs.graphs[padded]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        replay_ms = start.elapsed_time(end) / 20
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_batch(worker, cache, bs, 512, steps, vocab)
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events)
    print(
        f"\n=== {model} bs {bs}: step wall {wall * 1e3:.3f} ms, graph replay alone {replay_ms:.3f} ms"
        f", all device time of a prefill + {steps - 1} steps {device_us / 1e3:.1f} ms"
    )
    print(events.table(sort_by="self_device_time_total", row_limit=14, max_name_column_width=70))

# host syncs inside the decode loop (after warm-up): each one's Python stack, once
seen: set[str] = set()


def show(message, category, filename, lineno, file=None, line=None):
    stack = "".join(traceback.format_stack(limit=8)[:-2])
    if stack not in seen:
        seen.add(stack)
        print(f"--- sync: {message}\n{stack}")


warnings.showwarning = show
warnings.simplefilter("always")
torch.cuda.set_sync_debug_mode("warn")
run_batch(worker, cache, 4, 64, 4, vocab)
torch.cuda.set_sync_debug_mode(0)
print(f"distinct sync sites: {len(seen)}")
