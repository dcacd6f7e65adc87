# call 3: the top-k sum kernel: GPU MoE tests, then Qwen3 batch-64 A/B (ABBA) against HEAD's worker
set -u
. scripts/gpu/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
echo "=== tests $(date +%T)"
timeout 130 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_fused_moe.py > $OUT/moe-tests.log 2>&1; tail -3 $OUT/moe-tests.log
echo "=== A/B $(date +%T)"
MODEL=random:qwen3-30b-a3b BATCH=64 WEIGHTS=bf16 TESTS=0 ROUNDS=2 RUN_TIMEOUT=60 bash scripts/gpu/latency_ab.sh .ab/before .
echo "=== end $(date +%T)"
