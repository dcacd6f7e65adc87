#!/usr/bin/env bash
# One device call for the batch-1 MoE GEMV (kernels/moe_gemv.py): its GPU tests, the three MoE
# models' decode latency through the stages that already measure them (model_checks.sh
# moe-latency, gpt_oss.sh latency, deepseek.sh latency: batch 1 takes the GEMV there, batch 64
# the grouped GEMMs), then the one-layer micro-bench (last: it prints as it goes, so a cut
# leaves the lines so far in its log). Each stage runs under its own limit, cut
# to what is left of BUDGET_S (default 570 s: the call stays under the 10-minute limit); a
# stage with under 30 s left is skipped and says so. Results (logs, JSON) under $OUT.
# Usage (device tool, carry [".whl"]): bash scripts/gpu/moe_gemv.sh [stages...]
# Stages (default: all, in this order):
#   tests    tests/gpu/test_fused_moe.py's GEMV, CUDA-graph, FP8 and MXFP4 tests (the three
#            shapes against float64 and the grouped GEMMs; a batch-1 layer replayed with new
#            routings; FP8 and MXFP4 experts at batch 1 and 64)
#   qwen3    Qwen3-30B-A3B shape, batch 1 and 64 decode (MBU over the experts read)
#   gpt-oss  gpt-oss-20b shape, batch 1 and 64: PASS at batch 1 >= 70% MBU
#   deepseek DeepSeek-V2-Lite shape, batch 1 and 64: PASS at batch 1 >= 60% MBU
#   bench    scripts/gpu/bench_moe_gemv.py: one layer, GEMV vs grouped vs the bandwidth floor,
#            1-8 tokens, FP8 and MXFP4 at batch 1, each kernel's tiles swept
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu/device_env.sh
stages=${*:-tests qwen3 gpt-oss deepseek bench}
BUDGET_S=${BUDGET_S:-570}

for stage in $stages; do
  stage_starts "$stage" || continue
  left=$((BUDGET_S - SECONDS))
  case $stage in
    tests)
      timeout "$(limit 80)" python3 -m pytest -q -rA -p no:cacheprovider \
        tests/gpu/test_fused_moe.py -k "gemv or cuda_graph or fp8 or mxfp4" 2>&1 \
        | tee "$OUT/moe-gemv-tests.log" | grep -E "passed|failed|Error|error" ;;
    bench)
      timeout "$(limit 150)" python3 scripts/gpu/bench_moe_gemv.py "$OUT/bench-moe-gemv.json" \
        2>&1 | tee "$OUT/bench-moe-gemv.log" | grep -E "===|Error|error" ;;
    # the model scripts' own stages, each with what is left of this call's budget
    qwen3) BUDGET_S=$left bash scripts/gpu/model_checks.sh moe-latency ;;
    gpt-oss) BUDGET_S=$left bash scripts/gpu/gpt_oss.sh latency ;;
    deepseek) BUDGET_S=$left bash scripts/gpu/deepseek.sh latency ;;
  esac
done
echo "=== done $(date +%T)"
