"""Where a GPU start's `model_setup` phase goes: 4.5-5.2 s of every 8B start on the H200, warm
caches or not, a quarter of a warm start.

The phase resolves the checkpoint (transformers' config class, whose import pulls in
torch._dynamo and sympy) and builds the network on the device, which first waits for the CUDA
context that `scheduler_process._start_cuda_context` creates on a thread. That overlap helps
only if creating the context lets the GIL go; if it holds it, the two run one after the other.

Each measurement runs in a fresh interpreter, page cache warm (run it after cold_start.py, with
its PYTHONPYCACHEPREFIX; it reads that checkpoint's config, else random:llama-3-8b's):
- `sequential`: the context alone, then the checkpoint's config and model source, then the
  network's allocation, each timed;
- `threaded`: as the scheduler runs them, the context on a thread beside the rest;
- `gil`: the context on a thread while the main thread counts how often it gets to run in
  1 ms steps: the longest gap says whether the context creation holds the GIL.

Usage on the device: python3 scripts/gpu/setup_anatomy.py OUT_JSON
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cold_start import CHECKPOINT  # torch-free

CHILD = r"""
import json, sys, threading, time
import torch
import radixserve.scheduler.scheduler_process  # what the scheduler imports before its setup
from radixserve.model_loader.loader import load_model_source
from radixserve.models.registry import get_model_class

mode, model = sys.argv[1], sys.argv[2]
times = {}

def context():
    start = time.perf_counter()
    torch.empty(1, device="cuda")
    times["context"] = time.perf_counter() - start

def setup():
    start = time.perf_counter()
    source = load_model_source(model, dtype="bfloat16", device="cuda", context_length=4096)
    times["source"] = time.perf_counter() - start
    start = time.perf_counter()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        get_model_class(source.config.architecture)(source.config.hf_config, None)
    torch.cuda.synchronize()
    times["network"] = time.perf_counter() - start

start = time.perf_counter()
if mode == "sequential":
    context()
    setup()
elif mode == "threaded":
    thread = threading.Thread(target=context)
    thread.start()
    setup()
    thread.join()
else:  # gil
    thread = threading.Thread(target=context)
    thread.start()
    last, gap = time.perf_counter(), 0.0
    while thread.is_alive():
        time.sleep(0.001)
        now = time.perf_counter()
        gap, last = max(gap, now - last), now
    times["longest_main_thread_gap"] = gap
times["total"] = time.perf_counter() - start
print(json.dumps(times))
"""


def main() -> None:
    model = str(CHECKPOINT) if (CHECKPOINT / "config.json").is_file() else "random:llama-3-8b"
    results: dict = {"model": model}
    for mode in ("sequential", "threaded", "gil", "sequential", "threaded", "gil"):
        done = subprocess.run(
            [sys.executable, "-c", CHILD, mode, model], capture_output=True, text=True
        )
        if done.returncode != 0:
            results.setdefault(mode, []).append({"error": done.stderr[-2000:]})
            print(mode, "failed:", done.stderr[-2000:], flush=True)
            continue
        times = json.loads(done.stdout.strip().splitlines()[-1])
        results.setdefault(mode, []).append(times)
        print(mode, {k: round(v, 3) for k, v in times.items()}, flush=True)
    Path(sys.argv[1]).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
