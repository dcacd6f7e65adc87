#!/usr/bin/env bash
# One device call: embeddings throughput of `--task embed` at batch 256 for a
# Qwen3-Embedding-0.6B shape (the qwen3-0.6b preset: random bf16 weights, last-token pooling,
# normalised), with transformers' Qwen3Model on the same weights and prompts as the peer in the
# same run (scripts/gpu/bench_embeddings.py). No tokenizer needed: token-id prompts.
# Usage (device tool, carry [".whl"]): bash scripts/gpu/embeddings.sh
#   BATCH (256), INPUT_LEN (512), REQUESTS (2048), PRESET (qwen3-0.6b), BUDGET_S (330)
# CPU dry run (no GPU; tiny shapes):
#   PATH=.venv/bin:$PATH OUT=/tmp/out PRESET=tiny-qwen3 BATCH=8 INPUT_LEN=32 REQUESTS=64 \
#     bash scripts/gpu/embeddings.sh
# Result: $OUT/embeddings.json, a line with both throughputs, and PASS/FAIL lines: the GPU
# parity tests (tests/gpu/test_pooling_gpu.py, $OUT/pytest_pooling.log), ours at
# least the peer's tokens/s, and every sampled embedding within cosine 0.99 of the peer's
# (bf16 on both sides).
set -u
. "$(dirname "$0")/device_env.sh"
BUDGET_S=${BUDGET_S:-330}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
  | tee "$OUT/gpu.txt"

echo "=== parity $(date +%T)"
# the pooling path against transformers on the GPU (tests/gpu/test_pooling_gpu.py; skipped on
# the CPU, where tests/integration/test_pooling_parity.py runs)
timeout "$(limit 120)" python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_pooling_gpu.py \
  > "$OUT/pytest_pooling.log" 2>&1
status=$?
tail -3 "$OUT/pytest_pooling.log"
if [ $status -ne 0 ]; then echo "FAIL pooling parity with transformers (pytest exit $status)"
elif grep -q " passed" "$OUT/pytest_pooling.log"; then echo "PASS pooling parity with transformers"
else echo "SKIP pooling parity: no CUDA here"; fi

echo "=== embeddings $(date +%T)"
timeout "$(limit 220)" python3 scripts/gpu/bench_embeddings.py \
  --preset "${PRESET:-qwen3-0.6b}" --batch "${BATCH:-256}" --input-len "${INPUT_LEN:-512}" \
  --requests "${REQUESTS:-2048}" --output "$OUT/embeddings.json" > "$OUT/embeddings.log" 2>&1
status=$?
tail -20 "$OUT/embeddings.log"
if [ $status -ne 0 ]; then
  echo "FAIL embeddings benchmark exited with $status"
  exit 1
fi

python3 - "$OUT/embeddings.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{r['preset']} on {r['device']} ({r['dtype']}), batch {r['batch']} x {r['input_len']} tokens,"
      f" {r['requests']} requests: radixserve {r['tokens_per_s']:.0f} tok/s,"
      f" transformers {r['peer_tokens_per_s']:.0f} tok/s (x{r['vs_peer']:.2f})")
print(("PASS" if r["vs_peer"] >= 1.0 else "FAIL") + f" throughput x{r['vs_peer']:.2f} of transformers (>= 1.0)")
print(("PASS" if r["min_cosine_vs_peer"] >= 0.99 else "FAIL")
      + f" embeddings agree with transformers: min cosine {r['min_cosine_vs_peer']:.5f} (>= 0.99)")
PY
echo "=== done $(date +%T)"
