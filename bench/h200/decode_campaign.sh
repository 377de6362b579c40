#!/usr/bin/env bash
# Device run: tune the decode workload with the split-KV family, tune the B=16 H=16 N=512
# prefill shape with the Hopper family, dump the results and compare with SDPA.
# Usage (on the GPU machine, repository root): bash bench/h200/decode_campaign.sh
# TRIALS (default 12) trials per decode problem; PREFILL=0 skips the prefill shape.
# WARM=results.json: each study measures that file's fastest configs first (tune --warm-start).
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache
logs=/tmp/decode_campaign; mkdir -p $logs
export FA2TUNE_DB_URL=sqlite:///$logs/decode.db
fa2="python3 -m fa2tune.cli"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $logs/env.txt
( time timeout ${DECODE_TIMEOUT:-360} $fa2 tune --workload bench/h200/decode_workload.yaml \
    --family splitkv ${WARM:+--warm-start $WARM} --trials ${TRIALS:-12} --time-budget ${DECODE_BUDGET:-5m} --target-ms 30 --summary-json $logs/decode_summary.json ) \
    > $logs/decode_tune.log 2>&1
tail -40 $logs/decode_tune.log
if [ "${PREFILL:-1}" = 1 ]; then
  ( time timeout ${PREFILL_TIMEOUT:-240} $fa2 tune --d 128 --n 512 --batch 16 --heads 16 --dtype fp16 \
      --causal no --family fa3 ${WARM:+--warm-start $WARM} --trials ${PREFILL_TRIALS:-20} --time-budget ${PREFILL_BUDGET:-150s} --target-ms 50 \
      --summary-json $logs/prefill_summary.json ) > $logs/prefill_tune.log 2>&1
  tail -15 $logs/prefill_tune.log
  ( timeout 120 python3 bench/compare_sdpa.py --db "$FA2TUNE_DB_URL" --d 128 --n 512 --batch 16 \
      --heads 16 --dtype fp16 --out $logs/prefill_compare ) > $logs/prefill_compare.log 2>&1
  tail -8 $logs/prefill_compare.log
fi
$fa2 dump -o $logs/h200_results_decode.json > $logs/dump.log 2>&1; tail -3 $logs/dump.log
rm -f $logs/decode.db-journal
tar czf $OUT/decode_campaign.tgz -C /tmp decode_campaign
