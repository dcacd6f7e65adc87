#!/usr/bin/env bash
# One device call: LoRA adapters' GPU must-shows (issue 34), in process
# (scripts/gpu/lora_bench.py), each stage a PASS/FAIL line:
# - correctness: tests/gpu/test_lora_gpu.py (PEFT's greedy tokens, 3 adapters + base mixed,
#   the kernels inside CUDA graphs, float32, then base rows alone replaying the graphs without
#   LoRA kernels; the same with speculation (ngram and draft) verifying adapter rows; the grouped decode kernels at the 8B gate/up shape in bf16; the batch-1
#   GEMV epilogue).
# - batch: Llama-3-8B shape (random bf16), 8 distinct rank-16 adapters (all seven projections)
#   spread over a batch of 64, against 64 base rows on the same server, steady decode tok/s,
#   median of ROUNDS alternating rounds: target >= 0.85x; CUDA graphs and overlap on.
# - single: batch 1 with one adapter against the base, same server: target >= 0.90x.
# - plain: the base model on a server without LoRA (batch 64 and 1), and against it: the
#   base rows of the LoRA server, which replay graphs captured without the LoRA kernels (want
#   ~1.00x), and the adapters' rows (informational). The targets are judged against the same
#   server's base rows, measured in alternating rounds: the first server of a call runs
#   3-7% faster than the later ones (2026-12-04 late night), so two servers compare fairly
#   only when neither runs first (PLAIN_FIRST=1 shows the effect).
# - kernels: the LoRA shrink/expand kernels of one decode step (32 layers x q/k/v, o, gate/up,
#   down; 64 rows over 8 slots, grouped by slot into 16-row blocks) replayed in a CUDA graph:
#   us per step against the adapters' bytes at 4.8 TB/s (informational: S-LoRA/Punica report
#   a few % to ~20% decode overhead), per projection in lora-kernels.json. With SWEEP=1 (the
#   default when STAGES=kernels alone), each projection's decode tiles too (kernels/lora.py
#   SHRINK_SWEEP, EXPAND_SWEEP at 64 rows over 8 adapters): the best shrink and expand per
#   projection, the step's total with them against the tiles before, in its "tile_sweep".
# - fp8: the decode and plain stages on FP8 base weights (--quantization fp8), the same bf16
#   adapters: against that server's base rows and against an FP8 server without LoRA (not in
#   the default set: `STAGES=fp8`).
# STAGES: the stages to run, in this order (default: correctness kernels decode plain).
# PLAIN_KV=same: the plain server's KV pool as large as the LoRA server's (read from
#   lora-decode.json): whether the pool's size is why the two servers' base rows differ.
# PLAIN_FIRST=1: the plain server measured before the LoRA one (plain runs last by default):
#   on 2026-12-04 late night it then ran 1.067x / 1.031x the LoRA server's base rows, while
#   measured last with the same pool (PLAIN_KV=same) it equalled them: the order, not the pool.
# The adapters (8 x ~84 MB) are written under /tmp/lora-bench first (about half a minute).
# Usage (device tool, carry [".whl"]): bash scripts/gpu/lora.sh
#   the tile sweep alone (~1-2 min): STAGES=kernels bash scripts/gpu/lora.sh
#   CPU dry run: DEVICE=cpu MODEL=random:tiny-llama TOKENS=4 BATCH=8 bash scripts/gpu/lora.sh
# Result: $OUT/lora-{decode,kernels,plain}.json (fp8: lora-{decode,plain}-fp8.json), the PASS/FAIL
# lines.
set -u
. "$(dirname "$0")/device_env.sh"
BUDGET_S=${BUDGET_S:-410}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-random:llama-3-8b}
COMMON="--model $MODEL --device $DEVICE --adapters ${ADAPTERS:-8} --rank ${RANK:-16}"
COMMON="$COMMON --tokens ${TOKENS:-128} --rounds ${ROUNDS:-2} --prompt-len ${PROMPT_LEN:-128}"
BENCH="python3 scripts/gpu/lora_bench.py"
STAGES=${STAGES:-correctness kernels decode plain}
SWEEP=${SWEEP:-$([ "$STAGES" = kernels ] && echo 1 || echo 0)}
stage() { [[ " $STAGES " == *" $1 "* ]]; }
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

if stage correctness && [ "$DEVICE" = cuda ]; then
  echo "=== correctness $(date +%T)"
  timeout "$(limit 120)" python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_lora_gpu.py \
    >"$OUT/lora-correctness.log" 2>&1
  tail -3 "$OUT/lora-correctness.log"
  if grep -q " passed" "$OUT/lora-correctness.log" \
    && ! grep -qE "[0-9]+ (failed|error)" "$OUT/lora-correctness.log"; then verdict=PASS
  elif grep -q "skipped" "$OUT/lora-correctness.log"; then verdict="SKIP (peft not importable here: carry its wheel)"
  else verdict=FAIL; fi
  echo "correctness $verdict: PEFT's greedy tokens, adapters mixed in CUDA graphs"
fi

if stage kernels; then
  echo "=== kernels $(date +%T)"
  if [ "$SWEEP" = 1 ]; then sweep="--sweep" kernels_s=180; else sweep="" kernels_s=90; fi
  timeout "$(limit $kernels_s)" $BENCH kernels $COMMON --batch "${BATCH:-64}" $sweep \
    --json "$OUT/lora-kernels.json" 2>&1 | tee "$OUT/lora-kernels.log" \
    | grep -E "^kernels sweep|Error|error" | tail -6
fi

# decode and plain for one base dtype: $1 the files' suffix ("" or "-fp8"), $2 the flags
decode() {
  echo "=== decode${1} $(date +%T)"
  timeout "$(limit 280)" $BENCH decode $COMMON --batch "${BATCH:-64}" $2 \
    --json "$OUT/lora-decode$1.json" 2>&1 | grep -E "^batch|^single|Error|error" \
    | sed "s/^/${1#-}${1:+ }/" | tail -4
}
plain() {
  echo "=== plain${1} $(date +%T)"
  kv=""
  if [ "${PLAIN_KV:-}" = same ] && [ -e "$OUT/lora-decode$1.json" ]; then
    kv="--max-total-tokens $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["max_total_tokens"])' "$OUT/lora-decode$1.json")"
  fi
  timeout "$(limit 120)" $BENCH plain $COMMON --batch "${BATCH:-64}" $2 $kv \
    --json "$OUT/lora-plain$1.json" 2>&1 | grep -E "^plain|Error|error" | tail -3
}
against_plain() {
  python3 - "$OUT" "$1" <<'PY'
import json, statistics, sys
from pathlib import Path
out, suffix = Path(sys.argv[1]), sys.argv[2]
label = suffix.lstrip("-") + " " if suffix else ""
try:
    decode, plain = (json.loads((out / f"lora-{k}{suffix}.json").read_text()) for k in ("decode", "plain"))
except (OSError, ValueError) as error:
    decode = plain = None
    print(f"{label}against plain: no result ({error})")
if decode:
    print(f"{label}KV pools: the LoRA server {decode.get('max_total_tokens')} tokens, the plain one"
          f" {plain.get('max_total_tokens')}")
for name, target in (("batch", 0.85), ("single", 0.90)) if decode else ():
    base = statistics.median(plain[name]["plain_tok_s"])
    ratio = statistics.median(decode[name]["lora_tok_s"]) / base
    print(f"{label}{name} vs plain: {ratio:.3f}x the base model on a server without LoRA (plain"
          f" {base:.0f} tok/s; informational: the target >= {target} is judged on the same server)")
    rows = statistics.median(decode[name]["base_tok_s"]) / base
    replays = decode[name].get("base_replays", {})
    print(f"{label}{name} base rows vs plain {'PASS' if rows >= 0.97 else 'FAIL'}: {rows:.3f}x (the LoRA"
          f" server's base rows replay graphs without LoRA kernels: {replays}; want >= 0.97)")
PY
}
# both servers of one base dtype, in the order asked ($1, $2 as decode's and plain's)
servers() {
  if [ "${PLAIN_FIRST:-0}" = 1 ]; then plain "$@"; decode "$@"; else decode "$@"; plain "$@"; fi
}

if stage decode && stage plain; then servers "" ""
elif stage decode; then decode "" ""
elif stage plain; then plain "" ""
fi
if stage decode || stage plain; then against_plain ""; fi
stage kernels && python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
try:
    kernels = json.loads((out / "lora-kernels.json").read_text())
    batch = next(k for k in kernels if k.endswith("_one_adapter")).removesuffix("_one_adapter")
    print(f"kernels: {kernels['us_per_step']} us a step at {batch} over {kernels['slots']} adapters"
          f" ({kernels[batch + '_one_adapter_shrink_expand_us']} us all of one adapter),"
          f" {kernels['rows1_shrink_expand_us']} us at batch 1; the adapters' bytes take"
          f" {kernels['bandwidth_limit_us']} us; a launch that does nothing, {kernels['layers']}"
          f" a step: {kernels['empty_shrink_us']} us")
    sweep = kernels.get("tile_sweep")
    if sweep:
        print(f"kernels tiles: the best per projection {sweep['best_us']} us a step, the tiles"
              f" before {sweep['before_us']}, the defaults {kernels['us_per_step']}")
        for name in ("qkv", "o", "gate_up", "down"):
            one = sweep[name]
            print(f"kernels tiles {name}: shrink {one['best_shrink']} expand {one['best_expand']}"
                  f" {one['pair_us']} (defaults {one['default_shrink']} {one['default_expand']})")
except (OSError, ValueError, KeyError, StopIteration) as error:
    print(f"kernels: no result ({error!r})")
PY

if stage fp8; then servers -fp8 "--quantization fp8"; against_plain -fp8; fi
echo "tp SKIP: one GPU here; LoRA under --tp-size 2 is checked against PEFT on the CPU (tests/integration/test_tensor_parallel.py)"
echo "=== done $(date +%T)"
