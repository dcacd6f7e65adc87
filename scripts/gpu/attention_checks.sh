#!/usr/bin/env bash
# One device call: install the carried FlashInfer wheels, run tests/gpu for the Triton
# backend, time both backends, then run tests/gpu for FlashInfer (whose JIT compiles are the
# slow part). Logs go under $OUT; the tables are printed last.
# Run from the repo root on the GPU machine, carrying .whl.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=worker
OUT=${OUT:-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=worker:/tmp/site
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" || true

run_pytest() {  # $1: log name, rest: pytest selection
  local log=$1; shift
  python3 -m pytest -q -p no:cacheprovider --maxfail=15 --timeout 240 -rfE "$@" \
    >"$OUT/$log" 2>&1
  echo "pytest $log exit $?"; grep -E "passed|failed|error|FAILED|ERROR" "$OUT/$log" | tail -25
}
run_pytest pytest_triton.log tests/gpu -k "not flashinfer"
PYTHONPATH=$PYTHONPATH:tests/gpu timeout 200 python3 scripts/gpu/bench_attention.py \
  --json "$OUT/bench_attention.json" >"$OUT/bench_attention.log" 2>&1
echo "bench exit $?"
run_pytest pytest_flashinfer.log tests/gpu -k flashinfer
tail -30 "$OUT/bench_attention.log"
