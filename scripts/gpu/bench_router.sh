#!/usr/bin/env bash
# One device call: what the router costs at 8B scale. One worker (random:llama-3-8b, one GPU)
# and `radixserve router` in front of it; `radixserve bench serving`'s load at each concurrency
# straight at the worker and through the router, alternating (direct, router, router, direct).
# The fleet issue asks the routed output-token throughput to be at least 0.97x the direct one.
# Usage (device tool, carry [".whl"]): bash scripts/gpu/bench_router.sh
# Result: $OUT/router-overhead-8b.json (+ server logs under $OUT/logs), a PASS/FAIL line.
set -u
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

timeout 560 python3 -m radixserve.entrypoints.cli bench router --scenario overhead \
  --worker-args "--model random:llama-3-8b --context-length 4096 --attention-backend triton" \
  --overhead-concurrency 1,32,128 --overhead-requests 256 --input-len 512 --output-len 256 \
  --log-dir "$OUT/logs" --output-json "$OUT/router-overhead-8b.json" 2>&1 | tail -8

python3 - "$OUT/router-overhead-8b.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
for row in rows:
    verdict = "PASS" if row["throughput_ratio"] >= 0.97 else "FAIL"
    print(f"concurrency {row['concurrency']:>4}: throughput x{row['throughput_ratio']:.3f} {verdict},"
          f" added TTFT p50 {row['added_ttft_p50_ms']:+.2f} ms,"
          f" added ITL p50 {row['added_itl_p50_ms']:+.3f} ms")
PY
echo "=== done $(date +%T)"
