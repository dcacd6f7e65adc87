#!/usr/bin/env bash
# call 2: MoE row twice, the split sweep for batches 2-32, grammar threads A/B
set -u
. scripts/gpu/device_env.sh
FINAL=$OUT
for r in 4 5; do
  echo "=== moe run $r $(date +%T)"
  OUT=$FINAL/run$r BUDGET_S=150 bash scripts/gpu/headline.sh latency-moe
done
echo "=== splits $(date +%T)"
timeout 200 python3 scripts/gpu/bench_attention.py --splits 1,2,3,4,6,8,16 --split-batches 2,4,8,16,32 \
  --split-contexts 512,2048,8192 --json $FINAL/splits.json > $FINAL/splits.log 2>&1; tail -60 $FINAL/splits.log
for t in 16 8 12 12 8 16; do
  echo "=== grammar threads=$t $(date +%T)"
  f=$FINAL/grammar-t$t-$SECONDS
  PYTHONPATH=".ab/g$t/worker:$SITE" timeout 100 python3 scripts/gpu/bench_grammar.py --model random:llama-3-8b \
    --tokenizer .whl/smollm2-tokenizer --output-json $f.json > $f.log 2>&1
  grep "^===" $f.log | tail -5
done
echo "=== done $(date +%T) ${SECONDS}s"
