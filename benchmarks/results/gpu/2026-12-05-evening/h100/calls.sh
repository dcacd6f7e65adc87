# call 1: carveout quick A/B (8B fp8 batch 1, ABBA) and the batch-64 step timelines (8B, Qwen3-MoE)
set -u
. scripts/gpu/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
echo "=== start $(date +%T)"
MODELS=random:llama-3-8b:fp8 ROUNDS=2 RUN_TIMEOUT=80 bash scripts/gpu/carveout_ab.sh
for spec in llama-3-8b:64:110 qwen3-30b-a3b:64:150; do
  IFS=: read m bs t <<< "$spec"
  echo "=== timeline $m $bs $(date +%T)"
  PYTHONPATH=worker:scripts/gpu:$SITE timeout $t python3 scripts/gpu/decode_timeline.py random:$m none $OUT/tl-$m-$bs.json --batch-size $bs > $OUT/tl-$m-$bs.log 2>&1
  grep -v "Warn\|warn" $OUT/tl-$m-$bs.log | grep -A 16 "^===" || tail -5 $OUT/tl-$m-$bs.log
done
echo "=== end $(date +%T)"
# call 2: the per-expert align kernel: GPU tests, Qwen3 batch-64 A/B (ABBA), its timeline; the 8B attention split sweep
set -u
. scripts/gpu/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
echo "=== tests $(date +%T)"
timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_fused_moe.py > $OUT/moe-tests.log 2>&1; tail -3 $OUT/moe-tests.log
echo "=== A/B $(date +%T)"
MODEL=random:qwen3-30b-a3b BATCH=64 WEIGHTS=bf16 TESTS=0 ROUNDS=2 RUN_TIMEOUT=100 bash scripts/gpu/latency_ab.sh .ab/before .
echo "=== timeline $(date +%T)"
PYTHONPATH=worker:scripts/gpu:$SITE timeout 80 python3 scripts/gpu/decode_timeline.py random:qwen3-30b-a3b none $OUT/tl-qwen3-64.json --batch-size 64 > $OUT/tl-qwen3-64.log 2>&1
grep -A 12 "^===" $OUT/tl-qwen3-64.log || tail -5 $OUT/tl-qwen3-64.log
echo "=== splits $(date +%T)"
PYTHONPATH=worker:tests/gpu:$SITE timeout 100 python3 scripts/gpu/bench_attention.py --splits 1,2,4,8 --json $OUT/splits.json 2>&1 | grep -v Warn
echo "=== end $(date +%T)"
