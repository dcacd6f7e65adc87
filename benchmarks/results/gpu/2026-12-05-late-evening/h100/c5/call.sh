#!/usr/bin/env bash
# call 5 (the command as run; call-intended.sh was not carried): the skinny GEMM as landed
# (H100 tiles, launched plainly): its GPU tests, then the verify step
. scripts/gpu/device_env.sh; timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_skinny_gemm.py tests/gpu/test_gemv.py > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log; timeout 75 python3 scripts/gpu/spec_decode_bench.py verify random:llama-3-8b --sizes 1,2,8 --tokens 40 > $OUT/verify.log 2>&1; grep "^verify\|Error" $OUT/verify.log; echo ${SECONDS}s
