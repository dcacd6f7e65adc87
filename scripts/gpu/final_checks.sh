#!/usr/bin/env bash
# One device call for the session's last measurements, each stage under its own time limit cut
# to what is left of BUDGET_S: constrained decoding and its host cost (issue 14), the router's
# cost (issue 15) and cold start (issue 17, JSON written after each start; `import-footprint`
# and `setup-anatomy` after it, not by default). Logs and JSON under $OUT.
# Usage (device tool, carry [".whl"]): bash scripts/gpu/final_checks.sh [stages...]
set -u
. "$(dirname "$0")/device_env.sh"
stages=${*:-grammar-host grammar router cold-start grammar-tests}
BUDGET_S=${BUDGET_S:-500}
for stage in $stages; do
  stage_starts "$stage" 20 || continue
  case $stage in
    cold-start)
      timeout $(limit 420) python3 scripts/gpu/cold_start.py "$OUT" ${COLD_START_BACKENDS:-triton auto} 2>&1 | tail -12 ;;
    import-footprint)  # after cold-start (its checkpoint): how much of `imports` is the disk
      timeout $(limit 120) python3 scripts/gpu/import_footprint.py "$OUT/import-footprint.json" 2>&1 | tail -8 ;;
    setup-anatomy)  # after cold-start (its checkpoint): where model_setup goes, GIL included
      timeout $(limit 120) python3 scripts/gpu/setup_anatomy.py "$OUT/setup-anatomy.json" 2>&1 | tail -8 ;;
    grammar-host)  # the host's share of a constrained step, piece by piece, on this CPU
      timeout $(limit 90) python3 scripts/gpu/grammar_host_scan.py \
        --tokenizer .whl/smollm2-tokenizer --json "$OUT/grammar-host.json" 2>&1 | tail -40 ;;
    grammar)  # needs the xgrammar and apache-tvm-ffi wheels and .whl/smollm2-tokenizer
      timeout $(limit 170) python3 scripts/gpu/bench_grammar.py --model random:llama-3-8b \
        --tokenizer .whl/smollm2-tokenizer --output-json "$OUT/grammar-8b.json" 2>&1 | grep "===" ;;
    grammar-tests)
      timeout $(limit 150) python3 -m pytest -q -rA -p no:cacheprovider -s \
        tests/gpu/test_grammar_gpu.py 2>&1 | tee "$OUT/grammar-tests.log" | tail -3 ;;
    router)  # the router's cost at 8B scale; logs stay on the machine (8 files come back)
      timeout $(limit 200) python3 -m radixserve.entrypoints.cli bench router --scenario overhead \
        --worker-args "--model random:llama-3-8b --context-length 4096 --attention-backend triton" \
        --overhead-concurrency 32,128 --overhead-requests 128 --input-len 512 --output-len 128 \
        --log-dir /tmp/router-logs --output-json "$OUT/router-overhead-8b.json" 2>&1 | tail -8 ;;
  esac
done
echo "=== done $(date +%T)"
