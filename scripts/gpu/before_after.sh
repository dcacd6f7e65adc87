#!/usr/bin/env bash
# One device call: the same decode and offline benchmarks on two trees, alternating, so a
# change to the engine's structure is measured against the tree before it in the same run.
# Usage (device tool, carry [".whl", ".base"]): bash scripts/gpu/before_after.sh [ROUNDS]
#   .base/worker: the tree before (e.g. `git archive BASE worker | tar -x -C .base`)
#   worker:       the tree after (this checkout)
# Batch-1 decode of the 1B and 8B shapes (bench latency) and the offline 8B run (bench
# offline, 1000 requests), JSON under $OUT/{before,after}-*.json.
set -u
. "$(dirname "$0")/device_env.sh"
rounds=${1:-1}

run() {  # run TREE-LABEL TREE-DIR command...
  local label=$1 tree=$2; shift 2
  PYTHONPATH="$tree:$SITE" python3 -m radixserve.entrypoints.cli "$@" 2>&1 | tail -3
}

for round in $(seq "$rounds"); do
  for side in before after; do
    tree=worker; [ "$side" = before ] && tree=.base/worker
    echo "=== $side round $round $(date +%T)"
    for shape in llama-3.2-1b:1b llama-3-8b:8b; do
      timeout 120 bash -c "$(declare -f run); run $side $tree bench latency \
        --model random:${shape%%:*} --context-length 4096 --attention-backend triton \
        --batch-sizes 1 --input-len 512 --output-len 64 --transformers-output-len 0 \
        --output-json $OUT/$side-latency-${shape##*:}-r$round.json"
    done
    timeout 200 bash -c "$(declare -f run); run $side $tree bench offline \
      --model random:llama-3-8b --context-length 4096 \
      --num-prompts 1000 --input-len 1024 --input-len-min 256 --output-len 256 --output-len-min 64 \
      --transformers none --output-json $OUT/$side-offline-8b-r$round.json"
  done
done
echo "=== done $(date +%T)"
