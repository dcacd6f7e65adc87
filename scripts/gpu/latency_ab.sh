#!/usr/bin/env bash
# A kernel change against its base in one device call: batch-BATCH (default 1) decode of
# MODEL (default the Llama-3-8B shape), bf16 and --quantization fp8 (WEIGHTS="bf16" or "fp8"
# for one), for each tree named ("." is this one), ROUNDS times (default 1; 8B random init,
# capture and bench are ~20-45 s a run), trees interleaved in ABBA order (machines drift), with
# INPUT_LEN-token prompts (default 512; at most 4,048 in its 4,096-token context), on
# BACKEND's decode attention (default triton; a first flashinfer run on a fresh machine builds
# its modules: RUN_TIMEOUT=300); then, unless TESTS=0, the GPU tests a decode kernel change
# could break (~2 min; GPU_TESTS names others).
# The other trees travel untracked beside this one (add them to .git/info/exclude), e.g.:
#   mkdir ab-base && git archive main worker | tar -x -C ab-base
# Usage (device tool, carry [".whl"]): bash scripts/gpu/latency_ab.sh ab-base .
set -u
. "$(dirname "$0")/device_env.sh"
trees=${*:?name the trees to compare, "." for this one}
MODEL=${MODEL:-random:llama-3-8b}
LAT="--context-length 4096 --attention-backend ${BACKEND:-triton} --input-len ${INPUT_LEN:-512} --output-len 48"
reversed=$(printf '%s\n' $trees | tac | tr '\n' ' ')
for round in $(seq 1 "${ROUNDS:-1}"); do
  # odd rounds in the order given, even ones reversed (ABBA): the first server of a call runs
  # 3-7% faster than the later ones (2026-12-04 late night), so no tree keeps that place
  order=$([ $((round % 2)) = 1 ] && echo "$trees" || echo "$reversed")
  for tree in $order; do
    name=$([ "$tree" = . ] && echo head || basename "$tree")
    for weights in ${WEIGHTS:-bf16 fp8}; do
      q=$([ "$weights" = fp8 ] && echo "--quantization fp8")
      echo "=== $name $weights round $round $(date +%T)"
      result="$OUT/latency-$name${BACKEND:+-$BACKEND}${q:+-fp8}-$round.json"
      PYTHONPATH="$tree/worker:$SITE" timeout "${RUN_TIMEOUT:-90}" python3 -m radixserve.entrypoints.cli bench \
        latency --model "$MODEL" $LAT --batch-sizes "${BATCH:-1}" --transformers-output-len 0 $q \
        --output-json "$result" > "$result.log" 2>&1
      decode_step_line "$result" "$name $weights round $round" || tail -3 "$result.log"
    done
  done
done
[ "${TESTS:-1}" = 0 ] && exit 0
echo "=== tests $(date +%T)"
GPU_TESTS=${GPU_TESTS:-tests/gpu/test_fused_ops.py tests/gpu/test_gemv.py tests/gpu/test_fp8.py \
  tests/gpu/test_attention_backends.py tests/gpu/test_engine_gpu.py}
timeout 240 python3 -m pytest -q -rA -p no:cacheprovider $GPU_TESTS -k "not flashinfer" 2>&1 \
  | tee "$OUT/kernel-tests.log" | tail -5
