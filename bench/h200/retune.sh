#!/usr/bin/env bash
# Device run in two phases (each fits one 10-minute device call); both use one SQLite DB.
#   PHASE=fp16: precompile the fp16 space, tune fp16 on GPUs 0 and 1.
#   PHASE=bf16: precompile bf16, tune bf16 on GPUs 0 and 1, then compare_sdpa for both dtypes
#               (fp16 on GPU 0 and bf16 on GPU 1 at the same time; one process per GPU).
# DB=path of the SQLite file (copied in from a previous phase when the machine is fresh).
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache COLUMNS=160
DBFILE=${DBFILE:-/tmp/h200.db}; DB=sqlite:///$DBFILE
PHASE=${PHASE:?fp16 or bf16}; TRIALS=${TRIALS:-30}; BUDGET=${BUDGET:-6m}
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/env_$PHASE.txt
start=$(date +%s)
for d in 64 128; do for c in "" --causal; do
  python3 -m fa2tune.cli build --d $d --dtype $PHASE $c --jobs $(nproc) 2>&1 | tail -1
done; done > $OUT/precompile_$PHASE.txt
echo "precompile $(( $(date +%s) - start )) s" | tee -a $OUT/precompile_$PHASE.txt
t0=$(date +%s)
for dev in 0 1; do
  python3 -m fa2tune.cli --db $DB tune --dtype $PHASE --trials $TRIALS --time-budget $BUDGET \
    --device $dev --summary-json $OUT/summary_${PHASE}_$dev.json > $OUT/tune_${PHASE}_$dev.log 2>&1 &
  sleep 8
done
wait
echo "campaign $PHASE wall $(( $(date +%s) - t0 )) s" | tee -a $OUT/precompile_$PHASE.txt
if [ "$PHASE" = bf16 ]; then
  t0=$(date +%s)
  python3 bench/compare_sdpa.py --db $DB --dtype fp16 --device 0 --out $OUT/cmp_fp16 > $OUT/cmp_fp16.log 2>&1 &
  python3 bench/compare_sdpa.py --db $DB --dtype bf16 --device 1 --out $OUT/cmp_bf16 > $OUT/cmp_bf16.log 2>&1 &
  wait
  echo "compare wall $(( $(date +%s) - t0 )) s" | tee -a $OUT/precompile_$PHASE.txt
fi
python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()" $DBFILE
cp $DBFILE $OUT/h200.db
tail -30 $OUT/tune_${PHASE}_0.log; tail -5 $OUT/tune_${PHASE}_1.log
