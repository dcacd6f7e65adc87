#!/usr/bin/env bash
# call 2: skinny in-step probes; the Qwen3 batch-64 split caveat; splits-bs1 at 3,500 tokens; grammar one-pass
set -u
. scripts/gpu/device_env.sh
for t in skinny main; do
  echo "=== timeline bs2 no-pdl $t $(date +%T)"
  if [ $t = skinny ]; then pp=.ab/skinny/worker:/tmp/site; s=.ab/skinny/scripts/gpu; else pp=worker:/tmp/site; s=scripts/gpu; fi
  PYTHONPATH=$pp timeout 80 python3 $s/decode_timeline.py random:llama-3-8b none $OUT/timeline-$t.json \
    --batch-size 2 --no-pdl > $OUT/timeline-$t.log 2>&1; tail -3 $OUT/timeline-$t.log
done
echo "=== bench_skinny $(date +%T)"
PYTHONPATH=.ab/skinny/worker:/tmp/site timeout 100 python3 .ab/skinny/scripts/gpu/bench_skinny.py $OUT/skinny.json \
  > $OUT/skinny.log 2>&1; grep -i "interleav\|norm" $OUT/skinny.log | tail -12
echo "=== qwen3 bs64 $(date +%T)"
MODEL=random:qwen3-30b-a3b BATCH=64 WEIGHTS=bf16 ROUNDS=2 TESTS=0 bash scripts/gpu/latency_ab.sh .ab/d369d1c . 2>&1 | grep -v "^$" | tail -8
echo "=== splits-bs1 3500 $(date +%T)"
INPUT_LEN=3500 WEIGHTS=bf16 ROUNDS=2 TESTS=0 bash scripts/gpu/latency_ab.sh . .ab/splits-bs1 2>&1 | grep -v "^$" | tail -8
for t in main one-pass one-pass main; do
  echo "=== grammar $t $(date +%T)"
  pp=$([ $t = main ] && echo worker || echo .ab/$t/worker)
  g=$OUT/grammar-$t-$SECONDS
  PYTHONPATH=$pp:/tmp/site timeout 45 python3 scripts/gpu/bench_grammar.py --model random:llama-3-8b \
    --tokenizer .whl/smollm2-tokenizer --output-json $g.json > $g.log 2>&1
  grep "^===" $g.log | tail -2
done
echo "=== done $(date +%T) ${SECONDS}s"
