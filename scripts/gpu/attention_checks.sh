#!/usr/bin/env bash
# One device call: install the carried FlashInfer wheels, run tests/gpu for the Triton
# backend, then for FlashInfer (whose JIT compiles, tens of seconds per module, are the slow
# part; FLASHINFER_K narrows its selection), then time both backends. Each stage has its own
# time limit (TRITON_S, FLASHINFER_S, BENCH_S) so the call ends inside the lease.
# Logs go under $OUT; the bench table is printed last. Run from the repo root, carrying .whl.
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

run_pytest() {  # $1: seconds, $2: log name, rest: pytest selection
  local limit=$1 log=$2; shift 2
  timeout "$limit" python3 -m pytest -v -p no:cacheprovider --maxfail=15 -rfE "$@" \
    >"$OUT/$log" 2>&1
  echo "pytest $log exit $?"
  grep -cE " PASSED" "$OUT/$log" | sed 's/^/passed: /'
  grep -E "FAILED|ERROR|passed|failed" "$OUT/$log" | grep -v " PASSED" | tail -20
}
run_pytest "${TRITON_S:-120}" pytest_triton.log tests/gpu -k "not flashinfer"
run_pytest "${FLASHINFER_S:-300}" pytest_flashinfer.log tests/gpu -k "${FLASHINFER_K:-flashinfer}"
PYTHONPATH=$PYTHONPATH:tests/gpu timeout "${BENCH_S:-240}" python3 scripts/gpu/bench_attention.py \
  --json "$OUT/bench_attention.json" >"$OUT/bench_attention.log" 2>&1
echo "bench exit $?"
cat "$OUT/bench_attention.log"
