#!/usr/bin/env bash
# call 4: the split rule for batches 2-32 against HEAD; batch 1's split sweep; attention tests
set -u
. scripts/gpu/device_env.sh
echo "=== bs1 splits $(date +%T)"
PYTHONPATH=$PYTHONPATH:tests/gpu timeout 60 python3 scripts/gpu/bench_attention.py --splits 16,24,33,48,64 \
  --split-batches 1,24,48 --split-contexts 512,2048,8192 --json $OUT/splits-bs1.json > $OUT/splits-bs1.log 2>&1
grep "decode" $OUT/splits-bs1.log
BATCH=4,16 WEIGHTS=bf16 ROUNDS=2 TESTS=0 bash scripts/gpu/latency_ab.sh .ab/base .
echo "=== tests $(date +%T)"
timeout 150 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_attention_backends.py -k "not flashinfer" 2>&1 \
  | tee $OUT/attention-tests.log | tail -4
for r in sampled quiet; do
  [ $r = quiet ] && kill $SAMPLERS 2>/dev/null
  echo "=== grammar $r $(date +%T)"
  timeout 45 python3 scripts/gpu/bench_grammar.py --model random:llama-3-8b \
    --tokenizer .whl/smollm2-tokenizer --output-json $OUT/grammar-$r.json > $OUT/grammar-$r.log 2>&1
  grep "^===" $OUT/grammar-$r.log
done
echo "=== done $(date +%T) ${SECONDS}s"
