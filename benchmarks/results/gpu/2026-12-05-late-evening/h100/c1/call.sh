#!/usr/bin/env bash
# call 1 (2026-12-05 evening session): issue 34/36/38 figures on main; skinny probe
set -u
. scripts/gpu/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
echo "=== lora decode $(date +%T)"
STAGES=decode BUDGET_S=240 bash scripts/gpu/lora.sh 2>&1 | tail -6
mkdir -p $OUT/lora && mv $OUT/lora-*.json $OUT/lora/ 2>/dev/null
echo "=== gpt-oss $(date +%T)"
BUDGET_S=90 bash scripts/gpu/gpt_oss.sh latency 2>&1 | tail -4
echo "=== deepseek $(date +%T)"
BUDGET_S=90 bash scripts/gpu/deepseek.sh latency 2>&1 | tail -4
echo "=== verify main $(date +%T)"
timeout 75 python3 scripts/gpu/spec_decode_bench.py verify random:llama-3-8b --sizes 1 --tokens 40 \
  > $OUT/verify-main.log 2>&1; grep "^verify\|ratio\|Error" $OUT/verify-main.log | tail -4
for how in shipped split; do
  echo "=== skinny $how $(date +%T)"
  w=$([ $how = split ] && echo ".ab/skinny/scripts/gpu/carveout.py 100" || echo "")
  PYTHONPATH=.ab/skinny/worker:/tmp/site timeout 75 python3 $w .ab/skinny/scripts/gpu/spec_decode_bench.py verify \
    random:llama-3-8b --sizes 1,2 --tokens 40 > $OUT/verify-skinny-$how.log 2>&1
  grep "^verify\|ratio\|carveout\|Error" $OUT/verify-skinny-$how.log | tail -5
done
echo "=== done $(date +%T) ${SECONDS}s"
