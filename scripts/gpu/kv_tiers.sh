#!/usr/bin/env bash
# One device call: the host KV tier's GPU must-show (issue 35). random:llama-3-8b with its KV
# pool held to POOL tokens (32768) and 64 sessions of 8 turns over ~2k-token contexts (1024 to
# start, 128 new tokens and a 32-token reply a turn), CONCURRENCY (8) turns in flight: a working
# set ~4x the pool (scripts/gpu/kv_tiers.py says why this shape). One server
# per configuration: the tier off, then --kv-host-memory 16 with write_back and write_through
# (which default wins is read off these two). PASS when a tier gives >= 1.8x the output
# throughput and >= 2x lower TTFT p50 than off; also printed: decode ITL p50 against off and the
# restore bandwidth against the pinned host-to-device copy rate measured first.
# The tier-off path against the previous commit (batch-1 and offline within 2%): before_after.sh.
# Usage (device tool, carry [".whl"]): bash scripts/gpu/kv_tiers.sh
#   POOL, SESSIONS, CONCURRENCY, TURNS, INPUT_LEN, TURN_LEN, OUTPUT_LEN, HOST_GB, POLICIES, SERVE_ARGS
# CPU dry run: PRESET=tiny-llama VOCAB_RANGE=1000 POOL=512 SESSIONS=4 TURNS=3 INPUT_LEN=128 TURN_LEN=16 \
#   OUTPUT_LEN=4 HOST_GB=0.05 bash scripts/gpu/kv_tiers.sh
# First the tiers' GPU tests (exact bytes across streams; greedy outputs with graphs and overlap).
# Result: $OUT/kv-tiers.json (+ server logs), PASS/FAIL lines.
set -u
. "$(dirname "$0")/device_env.sh"
BUDGET_S=${BUDGET_S:-460}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
  | tee "$OUT/gpu.txt"
echo "=== tests/gpu/test_kv_tiers_gpu.py $(date +%T)"
timeout "$(limit 90)" python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_kv_tiers_gpu.py \
  2>&1 | tail -4
timeout "$(limit 420)" python3 scripts/gpu/kv_tiers.py "$OUT"
rc=$?
echo "=== done $(date +%T) rc=$rc"
exit $rc
