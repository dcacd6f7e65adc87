#!/usr/bin/env bash
# One-off device call 2: the f16-group tiles picked in the step, A/B'd; where the step goes.
set -u
. scripts/gpu/device_env.sh
export BUDGET_S=${BUDGET_S:-560}
echo "=== tests $(date +%T)"
timeout "$(limit 120)" python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_fp8.py \
  -k "f16_groups or takes or batch_one" 2>&1 | tee "$OUT/tests-groups.log" | tail -3
grep -q " passed" "$OUT/tests-groups.log" && ! grep -q " failed" "$OUT/tests-groups.log" || exit 4
echo "=== A/B $(date +%T)"
ROUNDS=2 WEIGHTS=fp8 TESTS=0 bash scripts/gpu/latency_ab.sh ab-main . 2>&1 | tee "$OUT/ab-fp8.log" | grep -A1 "decode ms" | grep -v "decode ms"
echo "=== timeline $(date +%T)"
timeout "$(limit 120)" python3 scripts/gpu/decode_timeline.py random:llama-3-8b fp8 "$OUT/timeline-groups.json" 2>&1 | grep -v Warn | tail -30
echo "=== bench alone $(date +%T)"
timeout "$(limit 150)" python3 scripts/gpu/bench_fp8_gemv.py "$OUT/bench-fp8-gemv.json" 2>&1 | grep "==="
echo "=== sass $(date +%T)"
timeout "$(limit 150)" python3 scripts/gpu/tile_sass.py 2>&1 | grep -v -i warn | tee "$OUT/tile-sass.txt"
echo "=== end $(date +%T)"
