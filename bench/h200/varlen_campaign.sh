#!/usr/bin/env bash
# Device run: tune the varlen workload (bench/h200/varlen_workload.yaml, the _vl configs of
# VARLEN_FAMILY (default fa2; fa2,fa3 on Hopper), the worker's varlen path; VARLEN_WARM=file
# measures that results file's fastest configs first), then re-time the shipped decode results on the current
# split-KV template (decode_campaign.sh with WARM=), and dump both databases.
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache COLUMNS=160
fa2="python3 -m fa2tune.cli"
if [ "${VARLEN:-1}" = 1 ]; then
  ( export FA2TUNE_DB_URL=sqlite:////tmp/varlen.db
    time timeout ${VARLEN_TIMEOUT:-300} $fa2 tune --workload ${VARLEN_WORKLOAD:-bench/h200/varlen_workload.yaml} \
      --family ${VARLEN_FAMILY:-fa2} ${VARLEN_WARM:+--warm-start $VARLEN_WARM} --trials ${VARLEN_TRIALS:-24} --target-ms 50 --summary-json $OUT/varlen_summary.json
    $fa2 dump -o $OUT/h200_results_varlen.json ) > $OUT/varlen_tune.log 2>&1
  tail -14 $OUT/varlen_tune.log
fi
if [ "${DECODE:-1}" = 1 ]; then
  WARM=db/data/h200_results_decode.json TRIALS=${DECODE_TRIALS:-5} PREFILL_TRIALS=5 \
    DECODE_BUDGET=3m PREFILL_BUDGET=60s OUT=$OUT bash bench/h200/decode_campaign.sh > $OUT/decode_retime.log 2>&1
  tail -8 $OUT/decode_retime.log
fi
