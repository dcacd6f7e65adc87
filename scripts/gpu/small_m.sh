#!/usr/bin/env bash
# One device call: the 2-16 row projection kernel (kernels/small_m.py, issue 38's verify step),
# each stage a PASS/FAIL line:
# - tests: tests/gpu/test_small_m.py (8B projections bf16/FP8 against references, graph replay
#   at 2/4/8/16, one compile for every row count, an 8B-shaped decode's graphs at batch 2-16
#   taking it), beside tests/gpu/test_gemv.py and tests/gpu/test_fp8.py (their dispatch cases).
# - bench: each Llama-3-8B projection (qkv, o, gate_up gated, down, lm_head) at M = 2, 4, 8,
#   16: small_m against cuBLAS and the bf16 bandwidth floor, CUDA graph replays from DRAM; FP8
#   at M = 8 against the per-token quantization + torch._scaled_mm it replaces; then a tile
#   sweep at M = 8 (its best per shape are small_m.block_config's candidates). PASS: small_m
#   beats cuBLAS at M = 8 on every projection.
# - verify: spec_decode.sh's verify stage (scripts/gpu/spec_decode_bench.py verify on
#   random:llama-3-8b): a k=4 verify step against a batch-1 decode step, device time, target
#   <= 1.15x (it was 1.25x with cuBLAS), and batch 2 and 4 beside it.
# Usage (device tool, carry [".whl"]): bash scripts/gpu/small_m.sh
#   One stage or some: STAGES="bench verify" bash scripts/gpu/small_m.sh
# Result: $OUT/small_m.json, $OUT/small_m-tests.log, $OUT/spec-verify-{small_m,cublas}.json,
# the PASS/FAIL lines.
set -u
. "$(dirname "$0")/device_env.sh"
BUDGET_S=${BUDGET_S:-420}
STAGES=${STAGES:-tests bench verify}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

for stage in $STAGES; do
  echo "=== $stage $(date +%T)"
  case $stage in
    tests)
      timeout "$(limit 150)" python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_small_m.py \
        tests/gpu/test_gemv.py tests/gpu/test_fp8.py >"$OUT/small_m-tests.log" 2>&1
      tail -3 "$OUT/small_m-tests.log"
      summary=$(tail -1 "$OUT/small_m-tests.log")
      if [[ $summary == *passed* && $summary != *failed* && $summary != *error* ]]; then
        verdict=PASS; else verdict=FAIL; fi
      echo "tests $verdict: small_m, gemv and fp8 GPU tests" ;;
    bench)
      timeout "$(limit 140)" python3 scripts/gpu/bench_small_m.py "$OUT/small_m.json" 2>&1 \
        | grep -E "M=|bench|Error|error" | tail -40 ;;
    verify)  # the command of spec_decode.sh's verify stage, at the sizes small_m serves; then
      # the same with 2-16 rows on cuBLAS (small_m.MAX_ROWS = 1 turns its dispatch off), an A/B
      # in one call: machines differ by more than the kernels do
      for side in small_m cublas; do
        off=""; [ $side = cublas ] && off="import radixserve.kernels.small_m as s; s.MAX_ROWS = 1;"
        echo "verify with 2-16 rows on $side:"
        timeout "$(limit 100)" python3 -c "$off import runpy, sys
sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')" \
          scripts/gpu/spec_decode_bench.py verify random:llama-3-8b \
          --device cuda --tokens "${VERIFY_TOKENS:-32}" --sizes "${SIZES:-1,2,4}" \
          --json "$OUT/spec-verify-$side.json" 2>&1 | grep -E "verify|Error|error" | tail -5
      done ;;
    *) echo "unknown stage $stage (tests, bench, verify)" ;;
  esac
done
echo "=== done $(date +%T)"
