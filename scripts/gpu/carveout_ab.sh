#!/usr/bin/env bash
# Whether the SM's L1 / shared-memory split is where kernels with a shared-memory pipeline lose
# time in the step (scripts/gpu/carveout.py says why it is suspected): this tree's decode steps
# as shipped against every Triton kernel at one split (PERCENT, default 100: the most shared
# memory), ABBA over ROUNDS (default 2), one process each, in one device call:
# - batch-1 decode of each of MODELS (default the 8B shape in FP8, whose pipelined GEMVs sit
#   1.5-2 us a launch further over their floor than bf16's, and in bf16, and the 1B shape);
# - with VERIFY=1, spec_decode_bench.py's verify section on the 8B shape (k = 4, batches 1, 2
#   and 8: the products of 2-16 rows), for a tree whose small products stream through shared
#   memory (branch skinny-gemm).
# Usage (device tool, carry [".whl"]): bash scripts/gpu/carveout_ab.sh
#   MODELS="random:llama-3-8b:fp8" ROUNDS=1 bash scripts/gpu/carveout_ab.sh
#   CPU dry run (the plumbing; no Triton kernel loads there):
#   DEVICE=cpu BACKEND=torch_native MODELS=random:tiny-llama VERIFY=1 VERIFY_MODEL=random:tiny-llama \
#     ROUNDS=1 bash scripts/gpu/carveout_ab.sh
# Result: $OUT/carveout-*.json and their logs, one line a run.
set -u
. "$(dirname "$0")/device_env.sh"
PERCENT=${PERCENT:-100}
MODELS=${MODELS:-random:llama-3-8b:fp8 random:llama-3-8b random:llama-3.2-1b}
LAT="--context-length 4096 --attention-backend ${BACKEND:-triton} --input-len 512 --output-len 48"
LAT="$LAT --device ${DEVICE:-cuda}"
WRAP="python3 scripts/gpu/carveout.py $PERCENT"
for round in $(seq 1 "${ROUNDS:-2}"); do
  # odd rounds as shipped first, even rounds the split first: the first process of a call
  # runs a few % faster (docs/benchmark-log.md, 2026-12-04 late night)
  order=$([ $((round % 2)) = 1 ] && echo "shipped split" || echo "split shipped")
  for spec in $MODELS; do
    model=${spec%:fp8}
    q=$([ "$model" != "$spec" ] && echo "--quantization fp8")
    for how in $order; do
      run=$([ "$how" = split ] && echo "$WRAP -m" || echo "python3 -m")
      name="${model#*:}${q:+-fp8}-$how-$round"
      echo "=== $name $(date +%T)"
      timeout "${RUN_TIMEOUT:-90}" $run radixserve.entrypoints.cli bench latency --model "$model" \
        $LAT --batch-sizes 1 --transformers-output-len 0 $q \
        --output-json "$OUT/carveout-$name.json" > "$OUT/carveout-$name.log" 2>&1
      decode_step_line "$OUT/carveout-$name.json" "$name" || tail -3 "$OUT/carveout-$name.log"
      grep -h "^carveout.py" "$OUT/carveout-$name.log"
    done
  done
  [ "${VERIFY:-0}" = 1 ] || continue
  for how in $order; do
    run=$([ "$how" = split ] && echo "$WRAP" || echo "python3")
    echo "=== verify $how $round $(date +%T)"
    timeout "${RUN_TIMEOUT:-90}" $run scripts/gpu/spec_decode_bench.py verify "${VERIFY_MODEL:-random:llama-3-8b}" \
      --sizes 1,2,8 --tokens 40 --device "${DEVICE:-cuda}" > "$OUT/carveout-verify-$how-$round.log" 2>&1
    grep -h "^verify\|^carveout.py" "$OUT/carveout-verify-$how-$round.log"
  done
done
