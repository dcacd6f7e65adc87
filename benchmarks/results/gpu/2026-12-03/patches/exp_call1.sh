#!/usr/bin/env bash
# EXPERIMENT call 1 (2026-12-03): folded norms against main in the step; the GEMV variants alone.
set -u
. scripts/gpu/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv | tee $OUT/gpu.txt
TESTS=0 timeout 260 bash scripts/gpu/latency_ab.sh ab-main ab-fold 2>&1 | tee $OUT/latency.txt
(cd ab-fold && PYTHONPATH=worker:$SITE timeout 150 python3 ../scripts/gpu/exp_gemv_variants.py $OUT/variants.json) 2>&1 | tail -80 > $OUT/variants.txt
tail -60 $OUT/variants.txt
