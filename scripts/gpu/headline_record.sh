#!/usr/bin/env bash
# Everything `scripts/headline_table.py record` needs for the whole table, in one device call
# of under 10 minutes: headline.sh's default stages twice (the spread of two runs; the grammar
# stage among them), then the cold start in the time left (CALL_S, default 570 s, less what
# the runs before took). Each default run gets RUN_S (default 225 s): on an H200 one took
# 167-174 s (2026-12-04), on an H100 a fresh machine's first 222 s and its second 200 s
# (2026-12-05 night: at 200 s the first run lost its last stage, the MoE one); the cold start
# with two warm starts took 146 s there. Each run in its own folder:
#   $OUT/run1, $OUT/run2 (the default stages), $OUT/run3 (cold-start)
# then, on this side: python3 scripts/headline_table.py record RUN/run1/headline.json
#   RUN/run2/headline.json RUN/run3/headline.json --measured "DATE, MACHINE, COMMIT"
# Usage (device tool, carry [".whl"]; scripts/gpu/fetch_wheels.sh also saves the grammar
# stage's tokenizer there): bash scripts/gpu/headline_record.sh
# DEVICE=cpu: a dry run of the plumbing (headline.sh's tiny models).
set -u
. "$(dirname "$0")/device_env.sh"
FINAL=$OUT
CALL_S=${CALL_S:-570}
for run in 1 2; do
  echo "=== run $run $(date +%T) (${SECONDS}s in)"
  OUT=$FINAL/run$run BUDGET_S=${RUN_S:-225} bash "$(dirname "$0")/headline.sh"
done
left=$((CALL_S - SECONDS))
echo "=== run 3: cold-start $(date +%T) (${SECONDS}s in, ${left}s left)"
OUT=$FINAL/run3 BUDGET_S=$left bash "$(dirname "$0")/headline.sh" cold-start
echo "=== record: python3 scripts/headline_table.py record RUN/run1/headline.json RUN/run2/headline.json RUN/run3/headline.json --measured ..."
