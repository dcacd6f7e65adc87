#!/usr/bin/env bash
# Where a cold start's `imports` phase goes (issue 17): the scheduler process's imports with the
# page cache dropped, as they are and after reading the native libraries ahead (in parallel,
# whole files), and the sizes of those libraries. Needs root (drop_caches), as on the device.
# Usage: bash scripts/gpu/cold_imports.sh  (sources device_env.sh; JSON lines on stdout)
set -u
. "$(dirname "$0")/device_env.sh"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
libdirs=$(python3 - <<'PY'
import importlib.util, os
for name in ("torch", "nvidia", "triton"):
    spec = importlib.util.find_spec(name)
    if spec and spec.submodule_search_locations:
        print(*spec.submodule_search_locations)
PY
)
for d in $libdirs; do
  echo "{\"dir\": \"$d\", \"so_mb\": $(find "$d" -name '*.so*' -type f -printf '%s\n' | awk '{s+=$1} END {print int(s/1e6)}')}"
done
find $libdirs -name '*.so*' -type f -printf '%s %p\n' | sort -rn | head -12
probe='import time; t=time.time(); from radixserve.scheduler.scheduler_process import run_scheduler_process; print(round(time.time()-t, 2))'
drop; echo "{\"cold_imports_s\": $(python3 -c "$probe")}"
echo "{\"warm_imports_s\": $(python3 -c "$probe")}"
drop; t0=$(date +%s.%N)
find $libdirs -name '*.so*' -type f -print0 | xargs -0 -P 16 -n 4 cat > /dev/null
t1=$(date +%s.%N)
echo "{\"read_all_libs_s\": $(awk "BEGIN{print $t1 - $t0}"), \"then_imports_s\": $(python3 -c "$probe")}"
drop; t0=$(date +%s.%N)
find $libdirs -name '*.so*' -type f -print0 | xargs -0 -P 16 -n 4 cat > /dev/null &
echo "{\"imports_beside_lib_read_s\": $(python3 -c "$probe")}"; wait
echo "{\"both_done_s\": $(awk "BEGIN{print $(date +%s.%N) - $t0}")}"
