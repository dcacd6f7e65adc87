#!/usr/bin/env bash
# call 4: the skinny GEMM with the H100's best tiles, not a dependent launch (skbn), against main, ABBA twice
set -u
. scripts/gpu/device_env.sh
for t in skbn main main skbn skbn main; do
  echo "=== $t $(date +%T)"
  if [ $t = main ]; then pp=worker; s=scripts/gpu; else pp=.ab/$t/worker; s=.ab/skinny/scripts/gpu; fi
  log=$OUT/verify-$t-$SECONDS.log
  PYTHONPATH=$pp:/tmp/site timeout 60 python3 $s/spec_decode_bench.py verify random:llama-3-8b \
    --sizes 1,2,8 --tokens 40 > $log 2>&1
  grep -h "^verify\|Error" $log | tail -3
done
echo "=== done $(date +%T) ${SECONDS}s"
