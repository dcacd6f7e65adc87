"""How much of a cold start's `imports` phase is the disk: the scheduler process's imports (the
engine, torch, its CUDA context) timed in a fresh interpreter with the page cache warm, dropped
with the disk idle, dropped with the weight read-ahead beside it (as a start runs them), and
dropped after the shared libraries that import maps had been read ahead in whole files, and
dropped with the start-up read-ahead (radixserve/read_ahead.py) beside it, then that read-ahead
followed by the weights' as a server's front end runs them.

Run on the device after cold_start.py (it reads the checkpoint cold_start.py wrote; export the
same PYTHONPYCACHEPREFIX). This process imports no torch: the pages a live process maps stay
in memory when the page cache is dropped. Usage: python3 scripts/gpu/import_footprint.py OUT_JSON
[--startup-only] (IMPORT_FOOTPRINT_ROUNDS=N repeats the start-up read-ahead's comparison). On a
CPU machine, as root: `COLD_START_PRESET=tiny-llama python3 scripts/gpu/cold_start.py OUT
torch_native`, then this with `--startup-only`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from cold_start import CHECKPOINT, DEVICE, KERNEL_CACHES, drop_page_cache  # torch-free

from radixserve import read_ahead  # torch-free
from radixserve.catalog import checkpoint_files  # torch-free

# rounds of the start-up read-ahead's comparison (cold, beside it, beside it then the weights)
ROUNDS = int(os.environ.get("IMPORT_FOOTPRINT_ROUNDS", "1"))

# what the scheduler process imports before it loads a model, and its CUDA context; prints
# the seconds, then its memory map (the shared libraries it mapped)
IMPORT = (
    "import time; t = time.perf_counter()\n"
    "import radixserve.scheduler.scheduler_process, torch\n"
    f"torch.zeros(1, device='{DEVICE}')\n"
    "print(time.perf_counter() - t)\n"
    "print(open('/proc/self/maps').read())\n"
)

# the weight read-ahead's (readers, chunk MB) settings tried beside the import; the script a
# reader process runs: it prints its GB/s
READ_AHEAD_VARIANTS = ((2, 8), (1, 8), (2, 1))
READ_AHEAD = (
    "import sys, time\n"
    "from radixserve.catalog import checkpoint_files as c\n"
    "c.READ_THREADS, c.CHUNK_BYTES = int(sys.argv[2]), int(sys.argv[3]) << 20\n"
    "t = time.perf_counter()\n"
    "print(c.prefetch(sys.argv[1]) / 1e9 / (time.perf_counter() - t))\n"
)


def timed_import() -> tuple[float, list[Path]]:
    out = subprocess.run(
        [sys.executable, "-c", IMPORT], capture_output=True, text=True, check=True
    ).stdout
    first, *maps = out.splitlines()
    # a mapping's line ends in its file's path; anonymous ones have five fields, no path
    paths = [line.split()[5] for line in maps if len(line.split()) >= 6]
    libraries = {Path(path) for path in paths if ".so" in Path(path).name}
    return float(first), sorted(p for p in libraries if p.is_file())


def read_whole(files: list[Path], threads: int = 2) -> float:
    """Read the files once, sequentially in 8 MB chunks, on `threads` threads; the seconds."""
    started = time.perf_counter()
    pending = list(files)
    lock = threading.Lock()

    def reader() -> None:
        buffer = bytearray(8 << 20)
        while True:
            with lock:
                if not pending:
                    return
                file = pending.pop(0)
            with file.open("rb", buffering=0) as f:
                while f.readinto(buffer):
                    pass

    workers = [threading.Thread(target=reader) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - started


def main() -> None:
    results: dict = {}
    if sys.argv[2:] != ["--startup-only"]:  # else the start-up read-ahead's comparison alone
        footprint(results)
    startup_read_ahead(results)
    Path(sys.argv[1]).write_text(json.dumps(results, indent=1))


def footprint(results: dict) -> None:
    """The import warm, cold, beside the weights' read-ahead, beside a process holding torch,
    and after the libraries were read whole."""
    results["warm_s"], libraries = timed_import()
    results["libraries"] = {str(p): p.stat().st_size for p in libraries}
    results["library_bytes"] = sum(results["libraries"].values())
    print(
        f"warm {results['warm_s']:.2f}s; {len(libraries)} libraries mapped, "
        f"{results['library_bytes'] / 1e9:.2f} GB",
        flush=True,
    )
    drop_page_cache()
    results["cold_idle_s"], _ = timed_import()
    print(f"cold, disk idle {results['cold_idle_s']:.2f}s", flush=True)
    # the weight read-ahead beside the import, as a start runs them: its readers and chunk
    # size against the import's time and its own throughput (it reads to the end)
    for threads, chunk_mb in READ_AHEAD_VARIANTS:
        drop_page_cache()
        read_ahead = subprocess.Popen(
            [sys.executable, "-c", READ_AHEAD, str(CHECKPOINT), str(threads), str(chunk_mb)],
            stdout=subprocess.PIPE,
            text=True,
        )
        import_s, _ = timed_import()
        gb_per_s = float(read_ahead.communicate(timeout=120)[0])
        key = f"cold_beside_read_ahead_{threads}x{chunk_mb}MB"
        results[key] = {"import_s": import_s, "read_ahead_gb_per_s": gb_per_s}
        print(
            f"cold, weights read beside ({threads} x {chunk_mb} MB): import {import_s:.2f}s, "
            f"read-ahead {gb_per_s:.2f} GB/s",
            flush=True,
        )
    # cold_start.py's own process imports torch: do the pages a live process maps survive
    # the drop (then its starts' imports were partly warm)?
    holder = subprocess.Popen([sys.executable, "-c", "import torch, time; time.sleep(600)"])
    time.sleep(8)
    drop_page_cache()
    try:
        results["cold_beside_torch_holder_s"], _ = timed_import()
    finally:
        holder.kill()
        holder.wait()
    print(f"cold, torch held by another process {results['cold_beside_torch_holder_s']:.2f}s")
    drop_page_cache()
    results["library_read_s"] = read_whole(libraries)
    results["after_library_read_s"], _ = timed_import()
    print(
        f"libraries read in {results['library_read_s']:.2f}s, then import "
        f"{results['after_library_read_s']:.2f}s",
        flush=True,
    )


def startup_read_ahead(results: dict) -> None:
    """The import with the page cache dropped, alone and beside the start-up read-ahead of the
    record cold_start.py's starts wrote (what a server's front end runs), then that read-ahead
    followed at once by the weights' read (the front end's gate opens when either the record is
    read or the imports are done), ROUNDS times interleaved: the import's times, and when each
    read ended, from the drop."""
    caches = sorted(KERNEL_CACHES.glob("*/radixserve"), key=lambda p: p.parent.name != "triton")
    if not caches:
        print("no start-up record: run cold_start.py first", flush=True)
        return
    os.environ["RADIXSERVE_CACHE_DIR"] = str(caches[0])
    extents = read_ahead.recorded_extents(1 << 40)
    results["startup_record"] = {
        "files": len({e.path for e in extents}),
        "bytes": sum(e.length for e in extents),
        "library_bytes": sum(e.length for e in extents if ".so" in e.path.name),
    }
    print("start-up record", results["startup_record"], flush=True)
    if not extents:
        return
    for _ in range(ROUNDS):
        drop_page_cache()
        results.setdefault("cold_idle_rounds_s", []).append(timed_import()[0])
        for then_weights in (False, True):
            drop_page_cache()
            ended: dict[str, float] = {}
            reader = threading.Thread(
                target=read_startup_files,
                args=(extents, then_weights, time.perf_counter(), ended),
            )
            reader.start()
            import_s, _ = timed_import()
            reader.join()
            key = "cold_beside_startup_read_ahead" + ("_then_weights" if then_weights else "")
            results.setdefault(key, []).append({"import_s": import_s, **ended})
            print(key, results[key][-1], flush=True)
    print("cold, disk idle, each round", results["cold_idle_rounds_s"], flush=True)


def read_startup_files(
    extents: list[read_ahead.Extent], then_weights: bool, started: float, ended: dict
) -> None:
    """The start-up read-ahead, then (`then_weights`) the weights' read at once; when each
    ended (seconds from `started`) and the weights' GB/s, into `ended`."""
    read_ahead.read_extents(
        extents, read_ahead.STARTUP_READ_THREADS, read_ahead.STARTUP_CHUNK_BYTES
    )
    ended["startup_read_s"] = time.perf_counter() - started
    if then_weights:
        gb = checkpoint_files.prefetch(str(CHECKPOINT)) / 1e9
        ended["weights_read_s"] = time.perf_counter() - started
        ended["weights_gb_per_s"] = gb / (ended["weights_read_s"] - ended["startup_read_s"])


if __name__ == "__main__":
    main()
