"""Host timings per step of the offline workload, in process, with each batch's GPU gap."""
import cProfile, pstats, random, time, sys, collections, statistics, json, os
import torch
from radixserve.boundary import TokenizedGenerateReqInput
from radixserve.model_loader.loader import load_model_source
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.scheduler.scheduler_process import build_scheduler
from radixserve.server_args import ServerArgs

model = sys.argv[1]; N = int(sys.argv[2]); dev = sys.argv[3]
source = load_model_source(model, dtype="auto", device=dev, context_length=4096)
args = ServerArgs(model=model, device=dev, context_length=4096, attention_backend="triton" if dev == "cuda" else "torch_native")
s = build_scheduler(args, source)
print("max running", s.max_running_requests, "max total", s.worker.max_total_tokens, flush=True)
rng = random.Random(0)
def submit(n, tag):
    for i in range(n):
        ids = [rng.randrange(10, 1000) for _ in range(rng.randint(256, 1024))]
        p = SamplingParams(max_new_tokens=rng.randint(64, 256), temperature=0.0, ignore_eos=True)
        s.dispatch(TokenizedGenerateReqInput(f"{tag}{i}", ids, p))
submit(8, "w")
while s.has_work(): s.step(); s.pop_outputs()
rows = []  # per launched batch: mode, form, launch host ms
gaps = []  # per batch in launch order: mode, gap ms
orig_add = s.worker.timeline.add
def add(pending, mode, tokens=0):
    before = sum(s.worker.timeline.gap_ms_before_mode.values())
    orig_add(pending, mode, tokens)
    gaps.append((mode, sum(s.worker.timeline.gap_ms_before_mode.values()) - before, tokens))
s.worker.timeline.add = add
orig_next, orig_launch, orig_resolve = s.get_next_batch_to_run, s._launch, s._resolve
cur = {}
def timed_next():
    a = time.perf_counter(); b = orig_next(); cur["form"] = time.perf_counter() - a; return b
def timed_launch(batch):
    a = time.perf_counter(); r = orig_launch(batch)
    rows.append({"mode": batch.forward_mode.metric_label, "form": cur["form"] * 1e3, "launch": (time.perf_counter() - a) * 1e3, "reqs": len(batch.reqs)}); return r
def timed_resolve(launched, masked=None):
    a = time.perf_counter(); launched.pending.resolve(); w = time.perf_counter() - a
    r = orig_resolve(launched, masked); rows[-1].setdefault("resolve_prev", []).append(((time.perf_counter() - a) * 1e3, w * 1e3, launched.mode.metric_label)); return r
s.get_next_batch_to_run = timed_next; s._launch = timed_launch; s._resolve = timed_resolve
submit(N, "r")
prof = cProfile.Profile()
if os.environ.get("PROF"): prof.enable()
start = time.perf_counter()
while s.has_work(): s.step(); s.pop_outputs()
prof.disable()
print("wall", time.perf_counter() - start, "batches", len(rows), len(gaps))
for r, g in zip(rows, gaps): r["gap"] = g[1]; r["tokens"] = g[2]
def summ(sel, key):
    v = [r[key] for r in sel]; return f"{key} mean {statistics.mean(v):.2f} p50 {statistics.median(v):.2f} max {max(v):.2f}" if v else ""
for mode in ("prefill", "decode"):
    sel = [r for r in rows if r["mode"] == mode]
    big = [r for r in sel if r["gap"] > 2]
    print(mode, len(sel), "gap>2ms", len(big), summ(sel, "gap"), "|", summ(sel, "form"), "|", summ(sel, "launch"), "|", summ(sel, "tokens"))
    print("  big-gap steps:", summ(big, "form"), "|", summ(big, "launch"), "|", summ(big, "reqs"), "|", summ(big, "tokens"))
# previous batch of each prefill with a big gap
prev = collections.Counter(rows[i - 1]["mode"] for i, r in enumerate(rows) if i and r["mode"] == "prefill" and r["gap"] > 2)
print("batch before a big-gap prefill:", dict(prev))
for i, r in enumerate(rows):
    if r["mode"] == "prefill" and r["gap"] > 8:
        print(" ex", i, json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}), "prev", rows[i-1]["mode"], round(rows[i-1]["launch"], 2), rows[i-1].get("resolve_prev"))
        if i > 400: break
out = os.environ.get("OUT", "/tmp")
json.dump(rows, open(f"{out}/steps.json", "w"))
if os.environ.get("PROF"): pstats.Stats(prof).sort_stats("tottime").print_stats(30)
