#!/usr/bin/env bash
# call 6, same machine as call 5: the verify step with the skinny table emptied (cuBLAS, main's
# behaviour) and as landed, one process each
. scripts/gpu/device_env.sh; for t in off on; do timeout 70 python3 -c "
import sys, runpy
sys.path.insert(0, 'scripts/gpu')
import radixserve.kernels.skinny_gemm as s
if '$t' == 'off': s.SKINNY_TILES.clear()
sys.argv = ['spec_decode_bench.py', 'verify', 'random:llama-3-8b', '--sizes', '1,2,8', '--tokens', '40']
runpy.run_path('scripts/gpu/spec_decode_bench.py', run_name='__main__')
" > $OUT/verify-$t.log 2>&1; echo "== $t"; grep "^verify\|Error" $OUT/verify-$t.log; done; echo ${SECONDS}s
