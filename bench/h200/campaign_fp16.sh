#!/usr/bin/env bash
# Device run: precompile the fp16 space, then one tuner per GPU against one SQLite DB.
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"  # results and logs land here
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache COLUMNS=160
DB=sqlite:////tmp/h200.db
DTYPE=${DTYPE:-fp16}; TRIALS=${TRIALS:-30}; LIMIT=${LIMIT:-450}
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv | tee $OUT/env.txt
start=$(date +%s)
for d in 64 128; do for c in "" --causal; do
  python3 -m fa2tune.cli build --d $d --dtype $DTYPE $c --jobs $(nproc) > /tmp/build_${d}${c}.log 2>&1
  tail -1 /tmp/build_${d}${c}.log
done; done | tee $OUT/precompile.txt
echo "precompile $(( $(date +%s) - start )) s" | tee -a $OUT/precompile.txt
t0=$(date +%s)
for dev in 0 1; do
  ( time timeout $LIMIT python3 -m fa2tune.cli --db $DB tune --dtype $DTYPE --trials $TRIALS --device $dev \
      --summary-json $OUT/summary_${DTYPE}_$dev.json ) > $OUT/tune_${DTYPE}_$dev.log 2>&1 &
  sleep 8
done
wait
echo "campaign wall $(( $(date +%s) - t0 )) s" | tee -a $OUT/precompile.txt
python3 -m fa2tune.cli --db $DB dump -o $OUT/h200_results_${DTYPE}.json 2>&1 | tail -2
python3 -c "import sqlite3; c=sqlite3.connect('/tmp/h200.db'); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()"
cp /tmp/h200.db $OUT/h200_${DTYPE}.db
tail -45 $OUT/tune_${DTYPE}_0.log; tail -8 $OUT/tune_${DTYPE}_1.log
