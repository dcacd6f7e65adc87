"""Cold start of a GPU worker, as a new pod pays it: process start to /ready 200.

Writes a Llama-3-8B-shaped safetensors directory (random bf16 weights, 4 shards, no tokenizer:
served through input_ids) to local disk, then for each attention backend starts
`radixserve serve` twice with the page cache dropped before each start: first with empty kernel
caches (a first-ever start), then with the caches the first start filled (a pod on a node that
served the model before). Each start records the time to /ready, the worker's own phase
breakdown (`radixserve_startup_seconds`) and the TTFT of ten same-shape requests sent one after
another (the first must be as fast as the tenth). Where `auto` served a start on triton while
FlashInfer's modules built in the background, the server is kept up until that build is done
(its time recorded), so the next start finds them, as the next pod on the node would.

When both triton and auto run (triton first), the warm starts after auto's first-ever start
and its FlashInfer build alternate, triton then auto: on 2026-12-02 a triton start in the
place right after the build was as slow as auto's had been there (22.3 s against 18.0-19.5
before the build, the extra in launch and imports, which run no backend code), so the machine
is slower for minutes after the build. After auto's first-ever start (whatever the backends)
the disk is synced and left COLD_START_SETTLE_S (default 60) to settle, as a node is long
after an earlier pod's build; what /proc/meminfo says is dirty or under writeback is recorded
before and after.

Python's bytecode is compiled first, into PYTHONPYCACHEPREFIX (set here unless given), as a
pod's image has it: `pip install` compiles every module it installs. The device's image ships
parts of torch without bytecode and cannot keep what a process compiles, and the wheels carried
to it are installed uncompiled, so without this every start there compiled about a thousand
modules (4.4 s of a 6.8 s model setup in a profile, scripts/gpu/profile_start.py).

This process imports no torch (the checkpoint is written by a child process): the pages a live
process maps stay in memory when the page cache is dropped, and a parent holding torch made
every start's imports partly warm (scripts/gpu/import_footprint.py measured a cold import at
4.8 s beside such a process against 6.2 s without; starts measured before 2026-12-02 had it).

Usage on the device: python3 scripts/gpu/cold_start.py OUT_DIR [backends...]
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from radixserve.bench.server_process import ServerProcess

PRESET = os.environ.get("COLD_START_PRESET", "llama-3-8b")  # a small one for a CPU dry run
DEVICE = "cuda" if Path("/dev/nvidiactl").exists() else "cpu"
CHECKPOINT = Path(f"/tmp/cold-start/{PRESET}")
KERNEL_CACHES = Path("/tmp/cold-start/kernel-caches")
SHARD_BYTES = 4 << 30
PORT = 8123


def write_checkpoint() -> None:
    """Write the checkpoint in a child process (torch stays out of this one)."""
    if not (CHECKPOINT / "config.json").exists():
        subprocess.run([sys.executable, __file__, "--write-checkpoint"], check=True)


def write_checkpoint_here() -> None:
    """The checkpoint itself: random bf16 weights in shards of SHARD_BYTES (torch is imported
    here, in the child process only)."""
    import torch
    from safetensors.torch import save_file

    from radixserve.catalog import checkpoint_files
    from radixserve.model_loader import random_init

    CHECKPOINT.mkdir(parents=True)
    hf_config = random_init.random_hf_config(PRESET)
    hf_config.torch_dtype = "bfloat16"
    hf_config.save_pretrained(CHECKPOINT)
    shard: dict = {}
    weight_map: dict[str, str] = {}

    def flush() -> None:  # each shard written once full: one in host memory at a time
        file = f"model-{len(set(weight_map.values())):05d}.safetensors"
        save_file(shard, str(CHECKPOINT / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
        shard.clear()

    size = 0
    for name, shape in random_init.parameter_shapes(hf_config):
        shard[name] = (torch.randn(shape, dtype=torch.bfloat16, device=DEVICE) * 0.02).cpu()
        size += shape.numel() * 2
        if size >= SHARD_BYTES:
            flush()
            size = 0
    if shard:
        flush()
    (CHECKPOINT / checkpoint_files.SAFETENSORS_INDEX).write_text(
        json.dumps({"weight_map": weight_map})
    )
    subprocess.run(["sync"], check=True)


def compile_bytecode() -> float:
    """Compile every module on sys.path's package directories into PYTHONPYCACHEPREFIX (which
    the servers inherit); the seconds it took. Done once, before any start: an image's build."""
    os.environ.setdefault("PYTHONPYCACHEPREFIX", str(CHECKPOINT.parent / "pycache"))
    started = time.perf_counter()
    dirs = [p for p in sys.path if p and Path(p).is_dir() and not Path(p, "os.py").exists()]
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j", "0", *dirs],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,  # a package's test data may not parse; the rest is compiled all the same
    )
    return time.perf_counter() - started


def drop_page_cache() -> bool:
    """Whether the page cache could be dropped (needs root, as on the device)."""
    subprocess.run(["sync"], check=True)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def sm_clock_mhz() -> int | None:
    """The GPU's SM clock now (nvidia-smi), None without one. The TTFTs of the 2026-12-02
    starts moved between about 21 and 35 ms within a series; read before each request, this
    says whether the slow ones ran at a lower clock."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def ttft_s(base_url: str, input_ids: list[int]) -> float:
    body = json.dumps(
        {"input_ids": input_ids, "sampling_params": {"max_new_tokens": 1, "ignore_eos": True}}
    ).encode()
    request = urllib.request.Request(
        f"{base_url}/generate", body, {"Content-Type": "application/json"}
    )
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as reply:
        reply.read()
    return time.perf_counter() - start


def start_once(backend: str, caches: Path, log: Path) -> dict:
    dropped = drop_page_cache()
    env = {
        **os.environ,
        "TRITON_CACHE_DIR": str(caches / "triton"),
        "FLASHINFER_WORKSPACE_BASE": str(caches / "flashinfer"),
        # the start-up read-ahead's record (radixserve/read_ahead.py): a first-ever start has
        # none, the next ones read what it recorded, as a node's next pod does
        "RADIXSERVE_CACHE_DIR": str(caches / "radixserve"),
    }
    args = ["--model", str(CHECKPOINT), "--attention-backend", backend]
    args += ["--context-length", "4096", "--device", DEVICE]
    start = time.perf_counter()
    server = ServerProcess(args, log, port=PORT, env=env)
    try:
        server.wait_ready(timeout=900)
        ready_s = time.perf_counter() - start
        metrics = server.get("/metrics")[1].decode()
        phases = {
            m.group(1): float(m.group(2))
            for m in re.finditer(r'radixserve_startup_seconds\{[^}]*phase="(\w+)"\} (\S+)', metrics)
        }
        vocab = json.loads((CHECKPOINT / "config.json").read_text())["vocab_size"]
        prompt = [(7 * i) % (vocab - 1) + 1 for i in range(512)]
        # each prompt differs in its first token: no prefix hit, every one a full prefill
        ttfts, clocks = [], []
        for i in range(10):
            clocks.append(sm_clock_mhz())
            ttfts.append(ttft_s(server.base_url, [i + 1] + prompt[1:]))
        background = wait_for_background_build(log)
    finally:
        server.stop()
    text = log.read_text()
    read_ahead = re.search(r"read [\d.]+ GB of weights ahead in .*", text)
    startup_read = re.search(r"read [\d.]+ GB of start-up files ahead in [\d.]+s", text)
    built = re.search(r"built them in [\d.]+s", text)
    served_by = re.search(r" on \w+, attention (\w+),", text)  # the engine's "loaded" line
    return {
        "ready_s": ready_s,
        "phases": phases,
        "ttft_s": ttfts,
        "sm_clock_mhz_before_each": clocks,
        "page_cache_dropped": dropped,
        "read_ahead": read_ahead[0] if read_ahead else None,
        "startup_read_ahead": startup_read[0] if startup_read else None,
        "served_by": served_by[1] if served_by else None,
        "flashinfer_built_at_start": built[0] if built else None,
        "background_build": background,
    }


def settle() -> dict:
    """Sync the disk and wait COLD_START_SETTLE_S; what the kernel says is dirty or under
    writeback (kB) before the sync, after it, and after the wait."""

    def pending() -> dict:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return {name: fields.get(name, "?").strip() for name in ("Dirty", "Writeback")}

    before = pending()
    start = time.perf_counter()
    subprocess.run(["sync"], check=True)
    sync_s = time.perf_counter() - start
    synced = pending()
    time.sleep(float(os.environ.get("COLD_START_SETTLE_S", "60")))
    return {"before": before, "sync_s": round(sync_s, 2), "synced": synced, "after": pending()}


def wait_for_background_build(log: Path, timeout_s: float = 300.0) -> str | None:
    """The background build's closing line, once it is written (None if none was started)."""
    if "a background process builds them" not in log.read_text():
        return None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := re.search(r"built \d+ FlashInfer modules in [\d.]+s", log.read_text()):
            return found[0]
        time.sleep(1)
    return f"not done in {timeout_s:.0f}s"


def start_order(backends: list[str], warm_runs: int) -> list[tuple[str, str]]:
    """(backend, kind) of each start in turn, ("settle", "") where the machine settles."""
    if backends == ["triton", "auto"]:  # auto's warm starts alternate with triton's
        starts = [("triton", "first_ever"), ("triton", "warm_caches"), ("auto", "first_ever")]
        starts.append(("settle", ""))
        for i in range(1, warm_runs + 1):
            starts += [
                ("triton", f"warm_caches_{i}_after_build"),
                ("auto", f"warm_caches_{i}_after_build"),
            ]
        return starts
    kinds = ["first_ever", "warm_caches"] + [f"warm_caches_{i}" for i in range(2, warm_runs + 1)]
    starts = [(backend, kind) for backend in backends for kind in kinds]
    if "auto" in backends:  # its first-ever start builds FlashInfer: let the machine settle
        starts.insert(starts.index(("auto", "first_ever")) + 1, ("settle", ""))
    return starts


def main() -> None:
    out = Path(sys.argv[1])
    backends = sys.argv[2:] or ["triton", "auto"]
    write_started = time.perf_counter()
    write_checkpoint()
    results: dict = {"checkpoint_write_s": time.perf_counter() - write_started}
    results["bytecode_compile_s"] = compile_bytecode()
    results["pycache_prefix"] = os.environ["PYTHONPYCACHEPREFIX"]
    print(f"bytecode compiled in {results['bytecode_compile_s']:.1f}s", flush=True)
    config = json.loads((CHECKPOINT / "config.json").read_text())
    results["checkpoint_gb"] = sum(f.stat().st_size for f in CHECKPOINT.iterdir()) / 1e9
    results["architecture"] = config["model_type"]
    # COLD_START_WARM_RUNS warm starts per backend (default 1): machines differ widely
    starts = start_order(backends, int(os.environ.get("COLD_START_WARM_RUNS", "1")))
    logs = CHECKPOINT.parent / "logs"  # on the machine: few files come back
    logs.mkdir(exist_ok=True)
    for backend, kind in starts:
        if backend == "settle":
            results["settle"] = settle()
            print("settled", results["settle"], flush=True)
            continue
        caches = KERNEL_CACHES / backend
        if kind == "first_ever":
            shutil.rmtree(caches, ignore_errors=True)
        run = start_once(backend, caches, logs / f"{backend}-{kind}.log")
        results[f"{backend}/{kind}"] = run
        print(backend, kind, f"ready {run['ready_s']:.1f}s", run["served_by"], flush=True)
        print("  ", run["phases"], run["flashinfer_built_at_start"], run["background_build"])
        print("  ttft ms", [round(t * 1e3, 1) for t in run["ttft_s"]], flush=True)
        print("  sm clock MHz before each", run["sm_clock_mhz_before_each"], flush=True)
        # after every start: a run cut short by its time limit still brings these back
        (out / "cold-start.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-checkpoint"]:
        write_checkpoint_here()
    else:
        main()
