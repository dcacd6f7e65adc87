#!/usr/bin/env bash
# One-off device call 4: f16 groups only where the step gained (B: gate_up and down; C: gate_up).
set -u
. scripts/gpu/device_env.sh
export BUDGET_S=${BUDGET_S:-420}
ROUNDS=2 WEIGHTS=fp8 TESTS=0 bash scripts/gpu/latency_ab.sh ab-main ab-B ab-C 2>&1 | tee "$OUT/ab.log" | grep -E "^===|^    1 "
WEIGHTS=bf16 TESTS=0 bash scripts/gpu/latency_ab.sh ab-main 2>&1 | grep -E "^===|^    1 "
(cd ab-B && timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8.py -k "f16_groups or batch_one" 2>&1 | tail -2)
echo "=== end $(date +%T)"
