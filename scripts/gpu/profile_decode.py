"""Where a decode step's time goes, per batch size: the whole step as bench latency runs it (host
and device, no overlap), the device time of the captured graph alone (replayed back to back),
the graph's kernels by device time a step (us a step, launches a step, us a launch: with
dependent launches a kernel's time includes its wait for the kernel before), and every host sync
the step makes. Batch 8 is also the speculative verify step's graph at k = 4, batch 1 (5 rows
padded to 8: the verify pass reaches the worker as decode rows).

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

REPLAYS = 10  # graph replays profiled a batch size
ROWS = 30  # kernels listed, by device time

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
    # the step's kernels: REPLAYS replays of its graph alone (no prefill among them), or without
    # graphs the whole run
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        if graphs is not None:
            for _ in range(REPLAYS):
                graph.replay()
            torch.cuda.synchronize()
        else:
            run_batch(worker, cache, bs, 512, steps, vocab)
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events)
    per = REPLAYS if graphs is not None else steps
    print(
        f"\n=== {model} bs {bs}: step wall {wall * 1e3:.3f} ms, graph replay alone {replay_ms:.3f} ms"
        f", kernels' device time {device_us / per / 1e3:.3f} ms a "
        + (f"replay ({REPLAYS} replays)" if graphs is not None else "step (prefill included)")
    )
    print(f"{'kernel':72s} {'us/step':>9s} {'calls/step':>10s} {'us/call':>8s}")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:ROWS]:
        if e.self_device_time_total:
            calls = e.count / per
            print(
                f"{e.key[:72]:72s} {e.self_device_time_total / per:9.1f} {calls:10.1f}"
                f" {e.self_device_time_total / e.count:8.2f}"
            )

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
