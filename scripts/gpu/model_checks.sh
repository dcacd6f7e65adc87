#!/usr/bin/env bash
# One device call for issue 16 (MoE, sliding window, Gemma, FP8 weights, FP8 KV): the GPU
# tests, then the benchmarks of docs/benchmarks.md, most important first. Each stage runs
# under its own time limit, cut to what is left of BUDGET_S (default 470 s: the whole call
# stays under 8 minutes); a stage with under 30 s left is skipped and says so. Results (logs,
# JSON) under $OUT.
# Usage (device tool, carry [".whl"] for flashinfer and friends, as engine_checks.sh):
#   bash scripts/gpu/model_checks.sh [stages...]
# Stages (default: all, in this order):
#   tests        tests/gpu: fused MoE vs reference, FP8 linears and KV, attention variants,
#                the new families on the fast path (GPU_TESTS overrides the selection)
#   fp8-gemv     batch-1 FP8 projections: the FP8 GEMV (batch 1's path) vs torch._scaled_mm
#                vs the bf16 GEMV, per 8B projection
#   fp8-latency  Llama-3-8B shape, batch-1 decode, bf16 then --quantization fp8 (MBU over
#                the bytes read, transformers beside the bf16 run)
#   fp8-logits   teacher-forced logits, fp8 vs bf16 on the same weights (cosine >= 0.99)
#   moe-latency  Qwen3-30B-A3B shape, batch 1 and 64 decode, MBU over the experts actually
#                read, transformers in the same run
#   fp8-offline  Llama-3-8B shape offline throughput, bf16 then fp8
#   moe-offline  Qwen3-30B-A3B shape offline throughput, transformers (batched) beside it
set -u
. "$(dirname "$0")/device_env.sh"
RS="python3 -m radixserve.entrypoints.cli"
stages=${*:-tests fp8-gemv fp8-latency fp8-logits moe-latency fp8-offline moe-offline}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
# the triton backend: nothing to JIT-compile on a fresh machine (FlashInfer builds a module
# per variant on first use, tens of seconds each); the tests cover FlashInfer where installed
LAT="--context-length 4096 --attention-backend triton --input-len 512 --output-len 48"
OFF="--context-length 4096 --attention-backend triton --input-len 1024 --input-len-min 256"

BUDGET_S=${BUDGET_S:-470}

for stage in $stages; do
  stage_starts "$stage" || continue
  case $stage in
    tests)
      timeout $(limit 200) python3 -m pytest -q -rA -p no:cacheprovider -s \
        ${GPU_TESTS:-tests/gpu/test_fused_moe.py tests/gpu/test_fp8.py \
          "tests/gpu/test_attention_backends.py::test_window_softcap_and_fp8_variants" \
          tests/gpu/test_models_gpu.py \
          tests/gpu/test_fused_ops.py::test_rotary_stores_into_fp8_cache \
          tests/gpu/test_fused_ops.py::test_gemma_norms} \
        2>&1 | tee "$OUT/model-tests.log" | grep -E "agreement|capacity|passed|failed|Error|error" ;;
    fp8-gemv)
      timeout $(limit 40) python3 scripts/gpu/bench_fp8_gemv.py "$OUT/fp8-gemv.json" 2>&1 | grep "===" ;;
    fp8-latency)
      timeout $(limit 75) $RS bench latency --model random:llama-3-8b $LAT --batch-sizes 1 \
        --transformers-output-len 16 --output-json "$OUT/latency-8b-bf16.json" 2>&1 | tail -4
      timeout $(limit 60) $RS bench latency --model random:llama-3-8b $LAT --batch-sizes 1 \
        --quantization fp8 --transformers-output-len 0 \
        --output-json "$OUT/latency-8b-fp8.json" 2>&1 | tail -3 ;;
    fp8-logits)
      timeout $(limit 170) python3 scripts/gpu/fp8_logits.py random:llama-3-8b "$OUT/fp8-logits-8b.json" \
        2>&1 | grep "===" ;;
    moe-latency)
      timeout $(limit 150) $RS bench latency --model random:qwen3-30b-a3b $LAT --batch-sizes 1,64 \
        --cuda-graph-max-bs 64 --transformers-output-len 8 \
        --output-json "$OUT/latency-qwen3-30b-a3b.json" 2>&1 | tail -6 ;;
    fp8-offline)
      for q in "" "--quantization fp8"; do
        timeout $(limit 75) $RS bench offline --model random:llama-3-8b $OFF --num-prompts 200 \
          --output-len 256 --output-len-min 64 --transformers none $q \
          --output-json "$OUT/offline-8b${q:+-fp8}.json" 2>&1 | tail -3
      done ;;
    moe-offline)
      timeout $(limit 120) $RS bench offline --model random:qwen3-30b-a3b $OFF --num-prompts 128 \
        --output-len 128 --output-len-min 32 --cuda-graph-max-bs 128 \
        --transformers batched --hf-batch-size 16 --hf-max-prompts 16 \
        --output-json "$OUT/offline-qwen3-30b-a3b.json" 2>&1 | tail -6 ;;
  esac
done
echo "=== done $(date +%T)"
