#!/usr/bin/env bash
# call 3: the split sweep for batches 2-32; grammar per-step distributions
set -u
. scripts/gpu/device_env.sh
echo "=== splits $(date +%T)"
PYTHONPATH=$PYTHONPATH:tests/gpu timeout 220 python3 scripts/gpu/bench_attention.py --splits 1,2,3,4,6,8,16 \
  --split-batches 2,4,8,16,32 --split-contexts 512,2048,8192 --json $OUT/splits.json > $OUT/splits.log 2>&1
tail -120 $OUT/splits.log
for r in 1 2 3; do
  echo "=== grammar $r $(date +%T)"
  timeout 100 python3 scripts/gpu/bench_grammar.py --model random:llama-3-8b \
    --tokenizer .whl/smollm2-tokenizer --output-json $OUT/grammar-$r.json > $OUT/grammar-$r.log 2>&1
  grep "^===" $OUT/grammar-$r.log
done
echo "=== done $(date +%T) ${SECONDS}s"
