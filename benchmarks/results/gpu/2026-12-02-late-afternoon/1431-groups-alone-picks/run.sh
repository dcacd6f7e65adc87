#!/usr/bin/env bash
# One-off device call 3: the f16-group tiles fastest alone, in the step against main; GPU tests.
set -u
. scripts/gpu/device_env.sh
export BUDGET_S=${BUDGET_S:-540}
echo "=== A/B $(date +%T)"
ROUNDS=2 TESTS=0 bash scripts/gpu/latency_ab.sh ab-main . 2>&1 | tee "$OUT/ab.log" | grep -E "^===|^    1 "
echo "=== step tiles $(date +%T)"
TILES="[(8, 512, 2, 4), (16, 512, 2, 4), (8, 1024, 4, 3), (16, 1024, 4, 3), (8, 512, 4, 3), (2, 1024, 2, 1)]" \
  timeout "$(limit 200)" python3 scripts/gpu/step_tiles.py fp8 "$OUT/step-tiles-groups.json" 2>&1 \
  | grep -E "^===|^  "
echo "=== tests $(date +%T)"
timeout "$(limit 200)" python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemv.py \
  tests/gpu/test_fp8.py tests/gpu/test_engine_gpu.py -k "not flashinfer" 2>&1 | tee "$OUT/tests.log" | tail -4
echo "=== end $(date +%T)"
