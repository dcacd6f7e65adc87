#!/usr/bin/env bash
# One device call for issue 36's DeepSeek part (MLA, the latent pool, DeepSeek's MoE): the GPU
# tests, then the measurements the issue asks for, most important first, on random weights at
# DeepSeek-V2-Lite's shape (random:deepseek-v2-lite: 27 layers, MLA over 512 + 64 latents,
# 64 experts of which 6 and 2 shared ones per token). Each stage runs under its own limit, cut
# to what is left of BUDGET_S (default 330 s, the call about 5.5 minutes); a stage with under
# 30 s left is skipped and says so. Results (logs, JSON) under $OUT.
# Usage (device tool, carry [".whl"]): bash scripts/gpu/deepseek.sh [stages...]
# Stages (default: all, in this order):
#   tests     tests/gpu/test_mla_gpu.py: the MLA decode kernel at 16 and 128 heads in bf16
#             (batch 1 to 64, ragged) and in a replayed CUDA graph, the extend kernel, the
#             absorbed projections' per-head GEMVs, tiny V3 and V2-Lite layouts on the fast
#             path (graphs, overlap) against their torch path; test_fused_moe.py's DeepSeek
#             cases (V3's grouped routing kernel, the shared add and the float32 router GEMV)
#   latency   V2-Lite shape, batch 1 and 64 decode: MBU over the bytes actually read (the
#             experts a step routes to, the latent KV); PASS at batch 1 >= 60%; transformers
#             (generate, batch 1) in the same run
#   latency-ab  V2-Lite shape, batch-1 decode step of the tree in .ab/worker (the device tool
#             carries ".ab": `git archive REV worker | tar -x -C .ab`) and of this one,
#             alternating, two rounds: a change's effect measured within one machine
#   profile   V2-Lite shape, batch-1 decode: the step's kernels by device time, the graph's
#             replay alone against the whole step (scripts/gpu/profile_decode.py): where the
#             1.2 ms over the bandwidth floor goes
#   mla-attn  MLA decode attention at 4k and 32k context, 16 and 128 heads, batch 1, 8, 64,
#             against the copy bandwidth (scripts/gpu/bench_mla.py), torch beside it
#   mla-extend  MLA prefill attention, the Triton extend path against the torch loop it
#             replaced, 16 and 128 heads (scripts/gpu/bench_mla_extend.py)
#   offline   V2-Lite shape offline throughput (128 prompts), transformers (batched) beside it
set -u
. "$(dirname "$0")/device_env.sh"
RS="python3 -m radixserve.entrypoints.cli"
stages=${*:-tests latency profile mla-attn mla-extend offline}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
MODEL=${MODEL:-random:deepseek-v2-lite}
LAT="--model $MODEL --context-length 4096 --input-len 512 --output-len 48"
OFF="--model $MODEL --context-length 4096 --input-len 1024 --input-len-min 256"
BUDGET_S=${BUDGET_S:-330}

for stage in $stages; do
  stage_starts "$stage" || continue
  case $stage in
    tests)
      timeout "$(limit 180)" python3 -m pytest -q -rA -p no:cacheprovider -s \
        tests/gpu/test_mla_gpu.py tests/gpu/test_fused_moe.py::test_grouped_noaux_tc_routing_kernel_matches_torch \
        tests/gpu/test_fused_moe.py::test_deepseek_shared_add_and_float32_router_at_v2_lite_sizes \
        2>&1 | tee "$OUT/mla-tests.log" \
        | grep -E "relative error|agreement|passed|failed|Error|error" ;;
    latency)
      timeout "$(limit 140)" $RS bench latency $LAT --batch-sizes 1,64 --cuda-graph-max-bs 64 \
        --transformers-output-len 8 --output-json "$OUT/latency-deepseek-v2-lite.json" \
        2>&1 | tee "$OUT/latency-deepseek-v2-lite.log" | tail -7
      python3 - "$OUT/latency-deepseek-v2-lite.json" <<'PY'
import json, sys
rows = {r["bs"]: r for r in json.load(open(sys.argv[1]))["rows"]}
mbu = rows[1]["decode_mbu"]
print(f"V2-Lite shape batch-1 decode: {rows[1]['decode_step_s'] * 1e3:.3f} ms, MBU {100 * mbu:.1f}%"
      f" of the bytes read: {'PASS' if mbu >= 0.60 else 'FAIL'} (target >= 60%)")
if 64 in rows:
    print(f"batch 64: {rows[64]['decode_tok_s']:.0f} tok/s, MBU {100 * rows[64]['decode_mbu']:.1f}%")
PY
      ;;
    latency-ab)
      for round in 1 2; do  # ABBA: the first run of a call is the fastest (see latency_ab.sh)
        for tree in $([ $round = 1 ] && echo ".ab/worker worker" || echo "worker .ab/worker"); do
          json="$OUT/latency-ab-${tree%%/*}-$round.json"
          PYTHONPATH="$tree:$SITE" timeout "$(limit 70)" python3 -m radixserve.entrypoints.cli \
            bench latency $LAT --batch-sizes 1 --transformers-output-len 0 \
            --output-json "$json" > "${json%.json}.log" 2>&1
          python3 - "$json" "$tree" "$round" <<'PY'
import json, sys
row = json.load(open(sys.argv[1]))["rows"][0]
print(f"{sys.argv[2]:<11} round {sys.argv[3]}: {row['decode_step_s'] * 1e3:.3f} ms, "
      f"MBU {100 * row['decode_mbu']:.1f}%")
PY
        done
      done ;;
    profile)
      timeout "$(limit 90)" python3 scripts/gpu/profile_decode.py "$MODEL" 1 triton \
        > "$OUT/profile-decode.log" 2>&1
      sed -n '/===/,/^$/p' "$OUT/profile-decode.log" | head -24 ;;
    mla-attn)
      timeout "$(limit 60)" python3 scripts/gpu/bench_mla.py "$OUT/mla-attention.json" 2>&1 \
        | grep -E "===|Error|error" ;;
    mla-extend)
      timeout "$(limit 60)" python3 scripts/gpu/bench_mla_extend.py "$OUT/mla-extend.json" 2>&1 \
        | grep -E "===|Error|error" ;;
    offline)
      timeout "$(limit 120)" $RS bench offline $OFF --num-prompts 128 --output-len 128 \
        --output-len-min 32 --cuda-graph-max-bs 128 \
        --transformers batched --hf-batch-size 16 --hf-max-prompts 16 \
        --output-json "$OUT/offline-deepseek-v2-lite.json" 2>&1 | tail -6 ;;
  esac
done
echo "=== done $(date +%T)"
