#!/usr/bin/env bash
# Device run on a 2-GPU host: re-measure the shipped fa2 results (db/data/h200_results.json) on
# the current template. fp16 on GPU 0 and bf16 on GPU 1 share one SQLite file; each of the 48
# problems (D 64/128, N 512-16384, B=2 H=16, causal and not) starts from the shipped file's
# TOP fastest verified configs (tune --warm-start) and runs TRIALS trials. Then fa2tune dump.
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache COLUMNS=160
DBFILE=/tmp/retime.db; export FA2TUNE_DB_URL=sqlite:///$DBFILE
TRIALS=${TRIALS:-6}; TOP=${TOP:-5}
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/retime_env.txt
t0=$(date +%s)
dev=0
for dt in fp16 bf16; do
  timeout ${TUNE_TIMEOUT:-480} python3 -m fa2tune.cli tune --dtype $dt --family fa2 \
    --warm-start db/data/h200_results.json --warm-start-top $TOP --trials $TRIALS \
    --device $dev --summary-json $OUT/retime_summary_$dt.json > $OUT/retime_tune_$dt.log 2>&1 &
  dev=$((dev + 1)); sleep 8
done
wait
echo "retime wall $(( $(date +%s) - t0 )) s" | tee -a $OUT/retime_env.txt
python3 -m fa2tune.cli dump -o $OUT/h200_results.json > $OUT/retime_dump.log 2>&1; tail -2 $OUT/retime_dump.log
tail -12 $OUT/retime_tune_fp16.log; tail -6 $OUT/retime_tune_bf16.log
