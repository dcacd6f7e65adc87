#!/usr/bin/env bash
# One device call for a restructuring: batch-1 8B decode and the offline 8B run on the tree
# before (.base/worker) and this one, alternating, then the API load script when present.
# Usage (device tool, carry [".whl", ".base"]): bash scripts/gpu/layout_checks.sh [PROMPTS]
#   .base/worker: `git archive BASE worker | tar -x -C .base`
set -u
. "$(dirname "$0")/device_env.sh"
prompts=${1:-500}
run() {  # run TREE-DIR command...
  local tree=$1; shift
  PYTHONPATH="$tree:$SITE" python3 -m radixserve.entrypoints.cli "$@" 2>&1 | tail -4
}
for side in before after before after; do
  tree=worker; [ "$side" = before ] && tree=.base/worker
  n=$(ls "$OUT" | grep -c "^$side-latency") 
  echo "=== $side latency 8b #$n $(date +%T)"
  timeout 100 bash -c "$(declare -f run); run $tree bench latency --model random:llama-3-8b \
    --context-length 4096 --attention-backend triton --batch-sizes 1 --input-len 512 \
    --output-len 48 --transformers-output-len 0 --output-json $OUT/$side-latency-8b-$n.json"
done
for side in before after; do
  tree=worker; [ "$side" = before ] && tree=.base/worker
  echo "=== $side offline 8b $(date +%T)"
  timeout 150 bash -c "$(declare -f run); run $tree bench offline --model random:llama-3-8b \
    --context-length 4096 --num-prompts $prompts --input-len 1024 --input-len-min 256 \
    --output-len 256 --output-len-min 64 --transformers none \
    --output-json $OUT/$side-offline-8b.json"
done
if [ -f scripts/gpu/api_load.sh ]; then
  echo "=== api load $(date +%T)"
  timeout 200 bash scripts/gpu/api_load.sh
fi
echo "=== done $(date +%T)"
