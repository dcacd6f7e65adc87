#!/usr/bin/env bash
# One-off device call 5: f16 groups for qkv, o and gate_up (D) or qkv and o (E), against main.
set -u
. scripts/gpu/device_env.sh
ROUNDS=2 WEIGHTS=fp8 TESTS=0 bash scripts/gpu/latency_ab.sh ab-main ab-D ab-E 2>&1 | tee "$OUT/ab.log" | grep -E "^===|^    1 "
WEIGHTS=bf16 TESTS=0 bash scripts/gpu/latency_ab.sh ab-main 2>&1 | tee "$OUT/ab-bf16.log" | grep -E "^===|^    1 "
echo "=== end $(date +%T)"
