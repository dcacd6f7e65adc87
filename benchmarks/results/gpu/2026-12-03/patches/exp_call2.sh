#!/usr/bin/env bash
# EXPERIMENT call 2 (2026-12-03): weight loads with eviction hints in the step (two rounds);
# where the folded-norm step loses (timelines of main and the folded tree, FP8).
set -u
. scripts/gpu/device_env.sh
TESTS=0 ROUNDS=2 timeout 400 bash scripts/gpu/latency_ab.sh ab-main ab-evict ab-cg 2>&1 | grep -v "bs  prefill" | tee $OUT/latency.txt
for t in ab-main ab-fold; do
  (cd $t && PYTHONPATH=worker:$SITE timeout 80 python3 ../scripts/gpu/decode_timeline.py random:llama-3-8b fp8 $OUT/timeline-$t-fp8.json 2>&1 | tail -25 > $OUT/timeline-$t-fp8.txt)
done
