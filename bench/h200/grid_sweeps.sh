#!/usr/bin/env bash
# Device run: exhaustive (grid) sweeps of two problems, one per GPU, for the sampler comparison.
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"  # results and logs land here
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache COLUMNS=160
cp ${SEED_DB:-h200.db} /tmp/h200.db; DB=sqlite:////tmp/h200.db
python3 -m fa2tune.cli build --d 128 --jobs 16 2>&1 | tail -1 &
python3 -m fa2tune.cli build --d 64 --causal --jobs 16 2>&1 | tail -1 &
wait
t0=$(date +%s)
( time timeout 200 python3 -m fa2tune.cli --db $DB tune --sampler grid --d 128 --n 4096 --causal no --device 0 ) > $OUT/grid0.log 2>&1 &
sleep 5
( time timeout 195 python3 -m fa2tune.cli --db $DB tune --sampler grid --d 64 --n 4096 --causal yes --device 1 ) > $OUT/grid1.log 2>&1 &
wait
echo "grid wall $(( $(date +%s) - t0 )) s"
python3 -c "import sqlite3; c=sqlite3.connect('/tmp/h200.db'); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()"
cp /tmp/h200.db $OUT/h200.db
tail -12 $OUT/grid0.log | cut -c1-160; tail -12 $OUT/grid1.log | cut -c1-160
