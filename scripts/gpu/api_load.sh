#!/usr/bin/env bash
# One device call: the Responses and Messages paths under load beside Chat Completions, on one
# server. `radixserve bench serving --api chat,responses,messages`: 64 concurrent streams, the
# same random-word prompts (512 tokens + the chat template) and 256 output tokens through each
# API, two rounds (chat, responses, messages, then reversed: drift cancels out), each run from
# a flushed prefix cache. The issue asks each API's output tok/s to be >= 0.97x chat's.
# Text APIs need a tokenizer, which random:<preset> models lack on the device (the bundled
# GGUF is not carried), so the Llama-3-8B shape is written as a safetensors directory (random
# bf16 weights, ~16 GB under /tmp, about a minute) beside the SmolLM2 tokenizer saved at
# .whl/smollm2-tokenizer (once, on this side: see scripts/gpu/bench_grammar.py's docstring).
# Usage (device tool, carry [".whl"]): bash scripts/gpu/api_load.sh
#   CONCURRENCY (64), REQUESTS (256), INPUT_LEN (512), OUTPUT_LEN (256), ROUNDS (2)
# Result: $OUT/api-load-8b.json (+ the server log $OUT/api-load-server.log), a PASS/FAIL line
# per API.
set -u
. "$(dirname "$0")/device_env.sh"
BUDGET_S=${BUDGET_S:-470}
PRESET=${PRESET:-llama-3-8b}  # or a config.json path (a tiny one for a CPU dry run)
CKPT=${CKPT:-/tmp/api-load/$(basename "$PRESET" .json)}
if [ ! -f .whl/smollm2-tokenizer/tokenizer.json ]; then
  echo "no .whl/smollm2-tokenizer: save it on this side first (scripts/gpu/bench_grammar.py)"
  exit 3
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

echo "=== checkpoint $(date +%T)"
timeout "$(limit 180)" python3 - "$CKPT" "$PRESET" <<'PY' || exit 4
import json, shutil, subprocess, sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from radixserve.catalog import checkpoint_files
from radixserve.model_loader import random_init

out = Path(sys.argv[1])
device = "cuda" if torch.cuda.is_available() else "cpu"
if not (out / checkpoint_files.SAFETENSORS_INDEX).exists():
    out.mkdir(parents=True, exist_ok=True)
    config = random_init.random_hf_config(sys.argv[2])
    config.torch_dtype = "bfloat16"
    config.save_pretrained(out)
    shard, weight_map, size = {}, {}, 0
    def flush():
        name = f"model-{len(set(weight_map.values())):05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        shard.clear()
    for name, shape in random_init.parameter_shapes(config):
        shard[name] = (torch.randn(shape, dtype=torch.bfloat16, device=device) * 0.02).cpu()
        size += shape.numel() * 2
        if size >= 4 << 30:
            flush()
            size = 0
    if shard:
        flush()
    (out / checkpoint_files.SAFETENSORS_INDEX).write_text(json.dumps({"weight_map": weight_map}))
for file in Path(".whl/smollm2-tokenizer").iterdir():
    shutil.copy(file, out / file.name)
print("checkpoint:", out, subprocess.run(["du", "-sh", str(out)], capture_output=True, text=True).stdout.split()[0])
PY

echo "=== bench $(date +%T)"
timeout "$(limit 560)" python3 -m radixserve.entrypoints.cli bench serving \
  --launch-server "--model $CKPT --context-length 4096 ${SERVE_ARGS:---attention-backend triton}" \
  --server-log "$OUT/api-load-server.log" \
  --api chat,responses,messages --rounds "${ROUNDS:-2}" --warmup-requests "${CONCURRENCY:-64}" \
  --max-concurrency "${CONCURRENCY:-64}" --num-requests "${REQUESTS:-256}" \
  --input-len "${INPUT_LEN:-512}" --output-len "${OUTPUT_LEN:-256}" --temperature 0 \
  --output-json "$OUT/api-load-8b.json" 2>&1 | tail -8

python3 - "$OUT/api-load-8b.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
for row in report["comparison"]:
    verdict = "PASS" if row["throughput_vs_ref"] >= 0.97 else "FAIL"
    print(f"{row['api']:<10} {row['completed']}/{row['num_requests']} requests,"
          f" {row['output_tokens']} tokens, {row['output_token_throughput']:.0f} tok/s:"
          f" x{row['throughput_vs_ref']:.3f} of chat {verdict}; TPOT x{row['tpot_vs_ref']:.3f},"
          f" ITL p50 {row['itl_p50_ms']:.2f} ms, TTFT p50 {row['ttft_p50_ms']:.1f} ms")
PY
echo "=== done $(date +%T)"
