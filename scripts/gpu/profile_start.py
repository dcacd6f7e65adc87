"""Where a warm GPU start's seconds go, function by function: the scheduler's start (model
setup, weights, KV, backend, graph capture, warm-up) replayed in one process under cProfile,
on the cold-start checkpoint (cold_start.py writes it and compiles the bytecode into
PYTHONPYCACHEPREFIX, which this must be given to see what a pod's image pays), with the CUDA
context created on a thread as the scheduler process does. The phase times of
`radixserve_startup_seconds` come with it, and the context's own time. Imports are apart:
`python -X importtime` beside it. Writes the report (.txt) and pstats' binary (.prof).

Usage on the device: PYTHONPYCACHEPREFIX=... python3 scripts/gpu/profile_start.py OUT_DIR [backend]
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import threading
import time
from pathlib import Path

started = time.perf_counter()
import torch  # noqa: E402

from radixserve.metrics.startup import StartupPhases  # noqa: E402
from radixserve.scheduler.scheduler_process import build_scheduler, warm_up  # noqa: E402
from radixserve.server_args import ServerArgs  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import cold_start  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1])
    backend = sys.argv[2] if len(sys.argv) > 2 else "triton"
    imports_s = time.perf_counter() - started
    cold_start.write_checkpoint()
    context_s: list[float] = []

    def create_context() -> None:
        t = time.perf_counter()
        torch.empty(1, device="cuda")
        context_s.append(time.perf_counter() - t)

    begin = time.perf_counter()
    threading.Thread(target=create_context, daemon=True).start()
    args = ServerArgs(
        model=str(cold_start.CHECKPOINT), attention_backend=backend, context_length=4096
    )
    startup = StartupPhases()
    profile = cProfile.Profile()
    profile.enable()
    scheduler = build_scheduler(args, startup=startup)
    with startup.timed("kernel_warmup"):
        warm_up(scheduler)
    profile.disable()
    total = time.perf_counter() - begin
    report = io.StringIO()
    report.write(f"imports (this script's) {imports_s:.2f}s; start {total:.2f}s; ")
    report.write(f"CUDA context on its thread {context_s}\n")
    report.write(f"phases { {k: round(v, 3) for k, v in startup.seconds.items()} }\n")
    for order, count in (("cumulative", 90), ("tottime", 40)):
        pstats.Stats(profile, stream=report).sort_stats(order).print_stats(count)
    (out / f"profile-start-{backend}.txt").write_text(report.getvalue())
    profile.dump_stats(out / f"profile-start-{backend}.prof")  # pstats reads it anywhere
    print(report.getvalue()[:1500])


if __name__ == "__main__":
    main()
