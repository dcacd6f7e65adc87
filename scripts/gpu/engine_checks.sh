#!/usr/bin/env bash
# One device call: engine correctness on the GPU, then the benchmarks of docs/benchmarks.md.
# Usage (device tool, carry [".whl"]): bash scripts/gpu/engine_checks.sh [stages...]
# Stages: tests latency offline overlap (default), latency-1b, latency-8b, overlap-8b, profile,
# profile-1b, host (where the host time of a 1B decode step goes), tp (needs two GPUs),
# grammar (constrained decoding's cost at batch 64 on the Llama-3-8B shape; needs the xgrammar
# and apache-tvm-ffi wheels and .whl/smollm2-tokenizer: docs/benchmarks.md, bench_grammar.py).
# Logs/JSON under $OUT.
set -u
. "$(dirname "$0")/device_env.sh"
RS="python3 -m radixserve.entrypoints.cli"
stages=${*:-tests latency offline overlap}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

latency() {  # one bench latency run: random:$1, results in latency-$2.json
  timeout 150 $RS bench latency --model "random:$1" --context-length 4096 \
    --attention-backend triton --batch-sizes 1,64,256 \
    --input-len 512 --output-len 48 --output-json "$OUT/latency-$2.json" 2>&1 | tail -7
}

overlap() {  # batch-64 decode of random:$1, overlap on and off: overlap$2.json, overlap$2-off.json
  for flag in "" "--disable-overlap"; do
    # triton: nothing to JIT-compile on a fresh machine (FlashInfer builds its head_dim-64
    # kernels on first use, which outlasted a 60 s limit on 2026-11-29)
    timeout 150 $RS bench offline --model "random:$1" --context-length 4096 \
      --attention-backend triton --cuda-graph-max-bs 64 \
      --num-prompts 64 --input-len 64 --output-len 512 --transformers none $flag \
      --output-json "$OUT/overlap$2${flag:+-off}.json" 2>&1 | tail -4
  done
}

for stage in $stages; do
  echo "=== $stage $(date +%T)"
  case $stage in
    tests)  # GPU_TESTS: the files to run (default: all of tests/gpu)
      timeout 400 python3 -m pytest -q -rA -p no:cacheprovider ${GPU_TESTS:-tests/gpu} -s \
        2>&1 | tee "$OUT/tests.log" | grep -E "agreement|gap|passed|failed|Error|error" ;;
    profile)
      timeout 120 python3 scripts/gpu/profile_decode.py random:llama-3.2-1b 1,64 triton \
        > "$OUT/profile-1b.txt" 2>&1; grep "===" "$OUT/profile-1b.txt"
      timeout 120 python3 scripts/gpu/profile_decode.py random:llama-3-8b 1 triton \
        > "$OUT/profile-8b.txt" 2>&1; grep "===" "$OUT/profile-8b.txt" ;;
    host)
      timeout 200 python3 scripts/gpu/profile_host.py random:llama-3.2-1b > "$OUT/host-1b.txt" 2>&1; grep "===" "$OUT/host-1b.txt" ;;
    profile-1b)
      timeout 120 python3 scripts/gpu/profile_decode.py random:llama-3.2-1b 1 triton \
        > "$OUT/profile-1b.txt" 2>&1; grep "===" "$OUT/profile-1b.txt" ;;
    latency) latency llama-3.2-1b 1b; latency llama-3-8b 8b ;;
    latency-1b) latency llama-3.2-1b 1b ;;
    latency-8b) latency llama-3-8b 8b ;;
    offline)
      timeout 220 $RS bench offline --model random:llama-3-8b --context-length 4096 \
        --num-prompts 1000 --input-len 1024 --input-len-min 256 --output-len 256 --output-len-min 64 \
        --transformers batched --hf-batch-size 64 --hf-max-prompts 64 \
        --output-json "$OUT/offline-8b.json" 2>&1 | tail -9
      timeout 90 $RS bench offline --model random:qwen3-0.6b --context-length 4096 \
        --num-prompts 256 --input-len 1024 --input-len-min 100 --output-len 1024 --output-len-min 100 \
        --transformers none --output-json "$OUT/offline-qwen3.json" 2>&1 | tail -6 ;;
    overlap) overlap llama-3.2-1b "" ;;
    grammar)
      timeout 200 python3 scripts/gpu/bench_grammar.py --model random:llama-3-8b \
        --tokenizer .whl/smollm2-tokenizer --output-json "$OUT/grammar-8b.json" 2>&1 | grep "===" ;;
    overlap-8b) overlap llama-3-8b -8b ;;
    tp)
      nvidia-smi topo -m > "$OUT/topo.txt" 2>&1; head -4 "$OUT/topo.txt"
      timeout 300 python3 -m pytest -x -q -rA -p no:cacheprovider tests/gpu/test_tensor_parallel_gpu.py -s \
        2>&1 | tee "$OUT/tp-tests.log" | grep -E "agreement|passed|failed|Error"
      for tp in 1 2; do
        # batch-1 decode through the whole engine: one request, short prompt, long output
        timeout 100 $RS bench offline --model random:llama-3-8b --context-length 4096 --tp-size $tp \
          --num-prompts 1 --input-len 128 --output-len 1024 \
          --transformers none --output-json "$OUT/bs1-8b-tp$tp.json" 2>&1 | tail -4
        timeout 150 $RS bench offline --model random:llama-3-8b --context-length 4096 --tp-size $tp \
          --num-prompts 300 --input-len 1024 --input-len-min 256 --output-len 256 --output-len-min 64 \
          --transformers none --output-json "$OUT/offline-8b-tp$tp.json" 2>&1 | tail -5
      done ;;
  esac
done
echo "=== done $(date +%T)"
