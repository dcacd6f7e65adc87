#!/usr/bin/env bash
# The regression guard of issue 39: the headline figures in one device call, each printed beside
# its last recorded value (benchmarks/headline.json) and its target, by scripts/headline_table.py
# (which also turns this call's $OUT/headline.json into docs/benchmarks.md's table: `record`).
# Each stage runs one existing driver under its own time limit, cut to what is left of BUDGET_S
# (default 450 s: the call stays under 8 minutes); a stage with under 30 s left is skipped and
# says so, and its figures print as "not run". Logs and the drivers' JSON under $OUT.
# Usage (device tool, carry [".whl"]): bash scripts/gpu/headline.sh [stages...]
# Stages (default: all but cold-start, in this order):
#   latency-8b    Llama-3-8B shape, batch 1 and 64 decode (bench latency, [A] of the page)
#   latency-fp8   the same shape, batch 1, --quantization fp8 (its MBU is "of the FP8 floor";
#                 the ratio to bf16 needs latency-8b in the same call)
#   latency-1b    Llama-3.2-1B shape, batch 1
#   offline       8B shape, 1000 requests, 256-1024 in, 64-256 out: tok/s, MFU, GPU idle ([C],
#                 without transformers)
#   grammar       bench_grammar.py, batch 64, every row / half the rows constrained against none
#                 ([D]; needs .whl/smollm2-tokenizer, saved as its docstring says; skipped
#                 without it)
#   latency-moe   Qwen3-30B-A3B shape, batch 1 and 64 ([B])
#   cold-start    cold_start.py triton ([E]): NOT in the default set. It writes the 16 GB
#                 checkpoint (~45 s), compiles the bytecode (~13 s) and starts the server with
#                 the kernel caches empty (~30-45 s), then COLD_START_WARM_RUNS (here 2 unless
#                 set) times with them warm (~18-36 s each): about 3-4 minutes, which do not fit
#                 beside the rest. Run it in a call of its own: `bash scripts/gpu/headline.sh
#                 cold-start`; its figures are the warm starts' (the spread of the two).
#   import-footprint  after cold-start in the same call (its checkpoint and bytecode), not in
#                 the default set: import_footprint.py --startup-only, the scheduler process's
#                 imports with the page cache dropped alone, beside the start-up read-ahead of
#                 cold-start's record, and beside it followed by the weights' read, as a start
#                 runs them, IMPORT_FOOTPRINT_ROUNDS (here 2 unless set) rounds (~2 minutes):
#                 `bash scripts/gpu/headline.sh cold-start import-footprint`. The full footprint
#                 (beside the weights' read alone, after the libraries read whole: on 2026-12-05
#                 it took the stage's whole limit) is the script without --startup-only.
# DEVICE=cpu: a dry run on this side (tiny random models, short runs, the bundled SmolLM2 for
# the grammar stage) that checks the plumbing; its figures mean nothing.
set -u
. "$(dirname "$0")/device_env.sh"
RS="python3 -m radixserve.entrypoints.cli"
stages=${*:-latency-8b latency-fp8 latency-1b offline grammar latency-moe}
BUDGET_S=${BUDGET_S:-450}

if [ "${DEVICE:-cuda}" = cpu ]; then
  echo "cpu (dry run)" > "$OUT/gpu.txt"
  M8=random:tiny-llama M1=random:tiny-llama MOE=random:tiny-qwen3-moe
  ENGINE="--device cpu --context-length 512"
  LAT="--input-len 32 --output-len 8"
  OFF="--num-prompts 16 --input-len 64 --input-len-min 16 --output-len 16 --output-len-min 4"
  GRAMMAR="--device cpu --model builtin:smollm2-135m --batch 4 --steps 16 --input-len 8"
  COLD="COLD_START_PRESET=tiny-llama"; COLD_BACKEND=torch_native
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
  M8=random:llama-3-8b M1=random:llama-3.2-1b MOE=random:qwen3-30b-a3b
  # triton: nothing to JIT-compile on a fresh machine (FlashInfer builds modules on first use)
  ENGINE="--context-length 4096 --attention-backend triton"
  LAT="--input-len 512 --output-len 48"
  OFF="--num-prompts 1000 --input-len 1024 --input-len-min 256 --output-len 256 --output-len-min 64"
  GRAMMAR="--model random:llama-3-8b --tokenizer .whl/smollm2-tokenizer"
  COLD=""; COLD_BACKEND=triton
fi

run() {  # run STAGE LIMIT command...: the stage's output in $OUT/STAGE.log (its "===" lines
  local stage=$1 lim; lim=$(limit "$2"); shift 2  # printed; its tail too if it failed)
  timeout "$lim" "$@" > "$OUT/$stage.log" 2>&1
  local rc=$?
  grep "^===" "$OUT/$stage.log"
  if [ $rc != 0 ]; then
    tail -n 5 "$OUT/$stage.log"
    [ $rc = 124 ] && echo "=== $stage TIMED OUT after ${lim}s" || echo "=== $stage FAILED (exit $rc)"
  fi
  return 0
}

latency() {  # latency STAGE LIMIT MODEL BATCH-SIZES [flags...]
  local stage=$1 lim=$2 model=$3 sizes=$4; shift 4
  run "$stage" "$lim" $RS bench latency --model "$model" $ENGINE $LAT --batch-sizes "$sizes" \
    --transformers-output-len 0 --output-json "$OUT/$stage.json" "$@"
}

for stage in $stages; do
  stage_starts "$stage" || continue
  case $stage in
    latency-8b) latency latency-8b 100 $M8 1,64 ;;
    latency-fp8) latency latency-8b-fp8 80 $M8 1 --quantization fp8 ;;
    latency-1b) latency latency-1b 60 $M1 1 ;;
    latency-moe) latency latency-moe 150 $MOE 1,64 --cuda-graph-max-bs 64 ;;
    offline)
      run offline-8b 150 $RS bench offline --model $M8 $ENGINE $OFF --transformers none \
        --output-json "$OUT/offline-8b.json" ;;
    grammar)
      if [ "${DEVICE:-cuda}" != cpu ] && [ ! -d .whl/smollm2-tokenizer ]; then
        echo "=== grammar SKIPPED: no .whl/smollm2-tokenizer (scripts/gpu/bench_grammar.py says how)"
        continue
      fi
      run grammar-8b 100 python3 scripts/gpu/bench_grammar.py $GRAMMAR \
        --output-json "$OUT/grammar-8b.json" ;;
    cold-start)
      run cold-start 420 env $COLD COLD_START_WARM_RUNS=${COLD_START_WARM_RUNS:-2} \
        python3 scripts/gpu/cold_start.py "$OUT" $COLD_BACKEND ;;
    import-footprint)
      run import-footprint 150 env PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-/tmp/cold-start/pycache}" \
        IMPORT_FOOTPRINT_ROUNDS="${IMPORT_FOOTPRINT_ROUNDS:-2}" $COLD \
        python3 scripts/gpu/import_footprint.py "$OUT/import-footprint.json" --startup-only
      grep -E "^(cold|start-up)" "$OUT/import-footprint.log" ;;
    *) echo "=== unknown stage $stage" ;;
  esac
done
echo "=== done $(date +%T) (${SECONDS}s)"
python3 scripts/headline_table.py collect "$OUT"
