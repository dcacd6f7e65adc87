# Sourced by the device scripts: $OUT, the carried wheels (scripts/gpu/fetch_wheels.sh fetches
# them on this side) installed once per machine into /tmp/site (runs on the GPUs of one machine
# share it), the worker and those wheels on PYTHONPATH, unbuffered Python, NVLink multicast
# off, and `limit` for budgeted stages.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"

# A call brings back at most 8 files of $OUT: the outermost script of a call (not one it
# runs) packs them, when there are more, into $OUT/out.tgz at its exit and keeps beside it
# only the files named in $KEEP_OUT (default headline.json): nothing is left out.
pack_out() {
  local n; n=$(find "$OUT" -type f | wc -l)
  [ "$n" -le 8 ] && return 0
  (cd "$OUT" && tar czf /tmp/out.tgz . && find . -type f $(printf -- "! -name %s " ${KEEP_OUT:-headline.json}) -delete \
    && find . -mindepth 1 -type d -empty -delete && mv /tmp/out.tgz out.tgz)
  echo "=== $n files in \$OUT: packed into out.tgz (kept: $(cd "$OUT" && ls | grep -v '^out.tgz$' | tr '\n' ' '))"
}
# The machine's state through the call, a line a second: the GPU's clocks, temperature, power
# and throttle reasons in $OUT/gpu-state.csv, the host's load and mean CPU clock in
# $OUT/host-state.csv, after a first line naming the host's kernel (gVisor reports 4.4.0;
# Firecracker its own: host-side timings differ between the two). The first server of a call
# ran 3-7% faster than the later ones (2026-12-04 late night); the stages' "=== STAGE
# HH:MM:SS" lines place each run in these.
sample_machine() {
  command -v nvidia-smi >/dev/null || return 0
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active \
    --format=csv -l 1 > "$OUT/gpu-state.csv" 2>/dev/null &
  SAMPLERS=$!
  (
    echo "# kernel $(uname -r), $(nproc) CPUs"
    echo "time,load1,load5,runnable,cpu_mhz"
    while true; do
      read -r l1 l5 _ running _ < /proc/loadavg
      mhz=$(awk '/^cpu MHz/ {s += $4; n++} END {if (n) printf "%.0f", s / n}' /proc/cpuinfo)
      echo "$(date +%T),$l1,$l5,$running,$mhz"
      sleep 1
    done
  ) > "$OUT/host-state.csv" 2>/dev/null &
  SAMPLERS="$SAMPLERS $!"
}
call_ends() {
  [ -n "${SAMPLERS:-}" ] && kill $SAMPLERS 2>/dev/null
  pack_out
}
if [ -z "${RADIXSERVE_DEVICE_SCRIPT:-}" ]; then
  export RADIXSERVE_DEVICE_SCRIPT=$$
  trap call_ends EXIT
  sample_machine
fi
# (the wheels are for the device's Python 3.12; a CPU dry run here uses this side's packages)
if ls .whl/*.whl >/dev/null 2>&1 && [ "$(ls .whl)" != "$(cat /tmp/site/.wheels 2>/dev/null)" ] \
  && python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
  rm -f /tmp/site/.imports  # other wheels: check the imports again
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && ls .whl > /tmp/site/.wheels
fi
export SITE=/tmp/site PYTHONUNBUFFERED=1
export PYTHONPATH="worker:$SITE"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Once a machine and wheel set: the worker imports with what was carried. Without this check
# a missing wheel fails every run of the call at its first import, and the call is lost.
if [ ! -e /tmp/site/.imports ]; then
  if ! python3 -c "import radixserve.entrypoints.cli" 2>"$OUT/imports.log"; then
    echo "the worker does not import here (scripts/gpu/fetch_wheels.sh, carry .whl):"
    tail -3 "$OUT/imports.log"
    exit 3
  fi
  mkdir -p /tmp/site && touch /tmp/site/.imports
fi

decode_step_line() {  # decode_step_line RESULT.json LABEL: a `bench latency` run's step and
  # MBU at each batch size from its JSON (the bench's own printout ends in its legend); status
  # 1 without it
  python3 - "$1" "$2" <<'PY'
import json, sys
for row in json.load(open(sys.argv[1]))["rows"]:
    step, mbu = row["decode_step_s"] * 1e3, row["decode_mbu"] * 100
    print(f"{sys.argv[2]}, batch {row['bs']}: decode step {step:.3f} ms, {mbu:.1f}% MBU")
PY
}

limit() {  # the stage's own limit $1, or what is left of $BUDGET_S if less (at least 1 s:
  local left=$((BUDGET_S - SECONDS))  # timeout 0 would mean no limit at all)
  left=$((left < 1 ? 1 : left))
  echo $((left < $1 ? left : $1))
}

stage_starts() {  # stage_starts STAGE [MIN_S]: its header line, or a SKIPPED line and status 1
  # when under MIN_S (30) of $BUDGET_S is left; the scripts' stage loops start with it
  if [ $((BUDGET_S - SECONDS)) -lt "${2:-30}" ]; then
    echo "=== $1 SKIPPED: ${SECONDS}s of the ${BUDGET_S}s budget used"
    return 1
  fi
  echo "=== $1 $(date +%T) (${SECONDS}s in)"
}
