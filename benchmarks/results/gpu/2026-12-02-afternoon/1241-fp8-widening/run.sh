#!/usr/bin/env bash
# Call 5: the FP8 GEMV widening e4m3 by bit moves (bytes, words) against the conversion
# instructions (main): each projection alone, then the FP8 step, two rounds; bf16 once.
set -u
BUDGET_S=${BUDGET_S:-480}
. scripts/gpu/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
PYTHONPATH=ab-main/worker:$SITE python3 -c "import radixserve.entrypoints.cli, radixserve.entrypoints.bench_latency" || exit 3
for tree in ab-main ab-fp8-word-unpack; do
  echo "=== alone $tree $(date +%T)"
  PYTHONPATH=$tree/worker:scripts/gpu:$SITE timeout $(limit 70) python3 scripts/gpu/bench_fp8_gemv.py "$OUT/fp8-gemv-$tree.json" 2>&1 | tail -12
done
WEIGHTS=fp8 ROUNDS=2 TESTS=0 timeout $(limit 200) bash scripts/gpu/latency_ab.sh ab-main ab-fp8-bit-unpack ab-fp8-word-unpack 2>&1 | tee "$OUT/ab.log" | grep -E "===|[0-9] +[0-9]"
OUT=$OUT/bf16 WEIGHTS=bf16 TESTS=0 timeout $(limit 40) bash scripts/gpu/latency_ab.sh ab-main 2>&1 | grep -E "===|[0-9] +[0-9]"
echo "=== tests $(date +%T)"
(cd ab-fp8-word-unpack && PYTHONPATH=worker:$SITE timeout $(limit 120) python3 -m pytest -q -rf -p no:cacheprovider \
  tests/gpu/test_gemv.py tests/gpu/test_fp8.py -k "not flashinfer" 2>&1 | tee "$OUT/tests.log" | tail -6)
echo "=== done $(date +%T)"
