#!/usr/bin/env bash
# One device call: where the decode step goes for the targets still missed, each model's graph
# profiled by scripts/gpu/profile_decode.py (its kernels by device time a step, the graph's
# replay alone against the whole step), triton attention, random bf16 weights.
# Stages (default: all, in this order), each under its own limit cut to what is left of
# BUDGET_S (default 540 s), skipped with under 30 s left:
#   8b       Llama-3-8B shape at batch 1, 8 and 64: batch 8 is the speculative verify step's
#            graph at k = 4 and batch 1 (issue 38: 1.285x a batch-1 step, target 1.15x), 64 the
#            batch-64 decode (issue 39: 75.0% MBU, target 82%, not profiled since 2026-12-03)
#   qwen3    Qwen3-30B-A3B shape at batch 1 and 64 (issue 39: 56.4% and 78.3%, targets 70, 82)
#   v2-lite  DeepSeek-V2-Lite shape at batch 1 (issue 36: 54.5%, target 60)
#   1b       Llama-3.2-1B shape at batch 1 (issue 39: 71.0%, target 80)
# Usage (device tool, carry [".whl"]): bash scripts/gpu/profiles.sh [stages...]
# Result: $OUT/profile-STAGE.log each, their "===" lines and kernel tables printed.
set -u
. "$(dirname "$0")/device_env.sh"
stages=${*:-8b qwen3 v2-lite 1b}
BUDGET_S=${BUDGET_S:-540}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

profile() {  # profile STAGE LIMIT MODEL SIZES
  timeout "$(limit "$2")" python3 scripts/gpu/profile_decode.py "$3" "$4" triton \
    > "$OUT/profile-$1.log" 2>&1
  local rc=$?
  sed -n '/^===/,/^$/p' "$OUT/profile-$1.log" | cut -c1-110
  [ $rc = 0 ] || { tail -n 4 "$OUT/profile-$1.log"; echo "=== $1 exit $rc"; }
}

for stage in $stages; do
  stage_starts "$stage" || continue
  case $stage in
    8b) profile 8b 200 random:llama-3-8b 1,8,64 ;;
    qwen3) profile qwen3 170 random:qwen3-30b-a3b 1,64 ;;
    v2-lite) profile v2-lite 100 random:deepseek-v2-lite 1 ;;
    1b) profile 1b 60 random:llama-3.2-1b 1 ;;
    *) echo "unknown stage $stage" ;;
  esac
done
echo "=== done $(date +%T) (${SECONDS}s)"
