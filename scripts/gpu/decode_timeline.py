"""One decode step's kernels in the order the captured graph runs them: each kernel's
device time and the idle gap before it, summed by kernel. Says whether a step's time over its
bandwidth floor is in the kernels' bodies (a kernel streaming below bandwidth) or between them
(launch and dependency gaps, which fusing kernels removes).

`--batch-size N`: the step of N requests (its graph captured too). `--no-pdl`: every kernel
launched plainly, not as a programmatic dependent: a dependent launch's time includes its wait
on the kernel before (its programs start early), so only without PDL is each kernel's time its
own, comparable with the same kernel timed alone (bench_gemv.py, bench_skinny.py): 2-16-row
kernels that were faster alone than cuBLAS made the step slower (2026-12-04, 2026-12-05), and
this is the measurement that says which launches lose the time in the step.

Usage: python3 scripts/gpu/decode_timeline.py MODEL [QUANTIZATION] [OUT.json] [--batch-size N]
  [--no-pdl]  (e.g. random:llama-3-8b fp8 $OUT/timeline-fp8.json; QUANTIZATION "none" for bf16)
"""

import argparse
import json
import os
import tempfile
from collections import defaultdict

import torch
from decode_worker import decode_worker
from torch.profiler import ProfilerActivity, profile

from radixserve.bench.latency import run_batch
from radixserve.kernels import triton_support

parser = argparse.ArgumentParser()
parser.add_argument("model", nargs="?", default="random:llama-3.2-1b")
parser.add_argument("quantization", nargs="?", default="none")
parser.add_argument("out", nargs="?")
parser.add_argument("--batch-size", type=int, default=1)
parser.add_argument("--no-pdl", action="store_true")
a = parser.parse_args()
model, out_path, bs = a.model, a.out, a.batch_size
quantization = None if a.quantization == "none" else a.quantization
if a.no_pdl:  # before any kernel launches: `dependent_launch` asks this for every launch
    triton_support._has_dependent_launch = lambda device_index: False
REPLAYS = 8
decode = decode_worker(model, quantization, max_bs=bs)
run_batch(decode.worker, decode.cache, bs, 512, 8, decode.vocab)
graphs = decode.runner.cuda_graph_runner.graphs
graph = graphs[min(size for size in graphs if size >= bs)]  # the graph the step replays

for _ in range(3):
    graph.replay()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(REPLAYS):
        graph.replay()
    torch.cuda.synchronize()
trace = os.path.join(tempfile.mkdtemp(), "trace.json")
prof.export_chrome_trace(trace)
with open(trace) as f:
    kernels = sorted(
        (e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"),
        key=lambda e: e["ts"],
    )
per_step = len(kernels) // REPLAYS
# the last full replay: every kernel's gap is then to a kernel of the same replay or the one before
step = kernels[-per_step:]
rows = []
for before, kernel in zip(kernels[-per_step - 1 : -1], step, strict=True):
    gap = kernel["ts"] - (before["ts"] + before["dur"])
    rows.append({"name": kernel["name"][:60], "us": kernel["dur"], "gap_us": gap})
by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
for row in rows:
    entry = by_name[row["name"]]
    entry[0] += 1
    entry[1] += row["us"]
    entry[2] += row["gap_us"]
busy = sum(r["us"] for r in rows)
idle = sum(r["gap_us"] for r in rows)
span = step[-1]["ts"] + step[-1]["dur"] - step[0]["ts"]
pdl = "PDL off" if a.no_pdl else "PDL as shipped"
print(f"=== {model} {quantization or 'bf16'}, batch {bs}, {pdl}: {per_step} kernels a step")
print(f"kernel time {busy:.1f} us, gaps {idle:.1f} us, first start to last end {span:.1f} us")
print(f"{'kernel':60} {'n':>4} {'us':>9} {'us each':>8} {'gap us':>8} {'gap each':>8}")
for name, (n, us, gap) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
    print(f"{name:60} {n:4d} {us:9.1f} {us / n:8.2f} {gap:8.1f} {gap / n:8.2f}")
print("one layer, in order:")
for row in rows[1:12]:
    print(f"  {row['name']:60} {row['us']:7.2f} us, gap {row['gap_us']:5.2f} us")
if out_path:
    with open(out_path, "w") as f:
        json.dump(
            {
                "model": model,
                "quantization": quantization,
                "batch_size": bs,
                "pdl": not a.no_pdl,
                "kernels": rows,
            },
            f,
            indent=1,
        )
