#!/usr/bin/env bash
# One device call: what KV events cost on the GPU. The same multi-turn load (bench serving,
# --api generate --turns 4: sessions whose turns carry the earlier ones, so the radix cache
# stores and, in a pool held to --max-total-tokens, evicts all the time) runs twice on one
# 8B-shaped random model: without --kv-events-endpoint, then with it and a subscriber that
# decodes every batch with vLLM's structs. The issue's bar for a feature: off costs nothing
# (the radix cache holds None), on must not slow the step loop: output tok/s with events
# >= 0.98x without, no update dropped (radixserve_kv_events_dropped_total 0), no sequence
# gap, every stored run chained to a stored parent.
# Usage (device tool): bash scripts/gpu/kv_events.sh
#   PRESET (llama-3-8b; tiny-llama for a CPU dry run), CONCURRENCY (64), REQUESTS (128),
#   INPUT_LEN (2048), OUTPUT_LEN (64), POOL (the --max-total-tokens, 65536), SERVE_ARGS
# Result: $OUT/kv-events-{off,on}.json, $OUT/kv-events-subscriber.json, the server logs, and
# PASS/FAIL lines.
set -u
. "$(dirname "$0")/device_env.sh"
BUDGET_S=${BUDGET_S:-360}
PRESET=${PRESET:-llama-3-8b}
PORT=${PORT:-5557}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
SERVE="--model random:$PRESET --max-total-tokens ${POOL:-65536} ${SERVE_ARGS:-}"
LOAD="--api generate --turns 4 --max-concurrency ${CONCURRENCY:-64} --num-requests ${REQUESTS:-128}
  --input-len ${INPUT_LEN:-2048} --output-len ${OUTPUT_LEN:-64} --warmup-requests 8"

run() {  # $1: off|on, $2: extra serve flags
  echo "=== events $1 $(date +%T)"
  # shellcheck disable=SC2086
  timeout "$(limit 170)" python3 -m radixserve.entrypoints.cli bench serving \
    --launch-server "$SERVE $2" --server-log "$OUT/kv-events-$1-server.log" $LOAD \
    --output-json "$OUT/kv-events-$1.json" 2>&1 | tail -4
}

run off ""
python3 scripts/gpu/kv_events_subscriber.py "tcp://127.0.0.1:$PORT" "$OUT/kv-events-subscriber.json" &
SUBSCRIBER=$!
run on "--kv-events-endpoint tcp://*:$PORT"
kill -TERM "$SUBSCRIBER"; wait "$SUBSCRIBER"

python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
off, on = (json.loads((out / f"kv-events-{k}.json").read_text()) for k in ("off", "on"))
sub = json.loads((out / "kv-events-subscriber.json").read_text())
ratio = on["output_token_throughput"] / off["output_token_throughput"]
log = (out / "kv-events-on-server.log").read_text()
print(f"output tok/s: off {off['output_token_throughput']:.0f}, on {on['output_token_throughput']:.0f}"
      f" -> x{ratio:.3f} {'PASS' if ratio >= 0.98 else 'FAIL'} (>= 0.98)")
print(f"TTFT p50 ms: off {off['ttft_ms']['p50']:.1f}, on {on['ttft_ms']['p50']:.1f}")
stored, removed = sub.get("BlockStored", 0), sub.get("BlockRemoved", 0)
ok = stored > 0 and removed > 0
print(f"subscriber: {sub['batches']} batches, {stored} BlockStored, {removed} BlockRemoved"
      f" {'PASS' if ok else 'FAIL'} (stores and evictions seen)")
print(f"sequence gaps {sub['gaps']}, broken parent chains {sub['broken_chains']}"
      f" {'PASS' if sub['gaps'] == 0 and sub['broken_chains'] == 0 else 'FAIL'}")
dropped = "kv events: dropped" in log
print(f"publisher queue drops: {'FAIL (logged)' if dropped else 'PASS (none logged)'}")
PY
echo "=== done $(date +%T)"
