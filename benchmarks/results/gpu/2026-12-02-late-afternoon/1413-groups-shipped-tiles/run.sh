#!/usr/bin/env bash
# One-off device call (2026-12-02 afternoon 2): the f16-group FP8 GEMV checked, A/B'd, tiled.
set -u
. scripts/gpu/device_env.sh
export BUDGET_S=${BUDGET_S:-570}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt"
echo "=== tests $(date +%T)"
timeout "$(limit 160)" python3 -m pytest -q -x -rA -p no:cacheprovider tests/gpu/test_fp8.py \
  -k "f16_groups or batch_one or linear_layer or takes" 2>&1 | tee "$OUT/tests-groups.log" | tail -8
grep -q " passed" "$OUT/tests-groups.log" && ! grep -q " failed" "$OUT/tests-groups.log" || exit 4
echo "=== A/B $(date +%T)"
ROUNDS=2 WEIGHTS=fp8 TESTS=0 bash scripts/gpu/latency_ab.sh ab-main . 2>&1 | tee "$OUT/ab-fp8.log"
WEIGHTS=bf16 TESTS=0 bash scripts/gpu/latency_ab.sh . 2>&1 | tee "$OUT/ab-bf16.log"
echo "=== step tiles $(date +%T)"
TILES="[(8, 1024, 2, 3), (16, 512, 2, 4), (16, 1024, 2, 3), (16, 1024, 4, 3), (8, 2048, 2, 2), (32, 512, 2, 4), (16, 2048, 4, 2)]" \
  timeout "$(limit 300)" python3 scripts/gpu/step_tiles.py fp8 "$OUT/step-tiles-groups.json" 2>&1 \
  | tee "$OUT/step-tiles.log" | grep -v Warn
echo "=== end $(date +%T)"
