#!/usr/bin/env bash
# Device run for the two-family product on a 2-GPU H200 host, in two calls (each < 10 min),
# both on one SQLite DB carried between them under $OUT (copy it back into DBIN for phase B).
#   PHASE=A: GPU 0: the GPU tiers (fa2 after the restructure, fa3 through the product), the
#            fa3 header check; GPU 1: the fp16 campaign over both families.
#   PHASE=B: bf16 campaign on GPUs 0 and 1, then compare_sdpa for fp16 (GPU 0) and bf16
#            (GPU 1): each problem's winner, the best of each family, SDPA flash and cuDNN.
# Environment: DBIN=path of a DB to start from (phase B), BUDGET (default 6m), TRIALS (30).
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache COLUMNS=160
DBFILE=/tmp/h200.db; DB=sqlite:///$DBFILE
[ -n "${DBIN:-}" ] && cp "$DBIN" $DBFILE
PHASE=${PHASE:?A or B}; TRIALS=${TRIALS:-30}; BUDGET=${BUDGET:-6m}
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/env_$PHASE.txt
nvcc --version | tail -1 >> $OUT/env_$PHASE.txt
NS=512,1024,2048,4096,8192,16384

tune() {  # dtype device [extra args]
  python3 -m fa2tune.cli --db $DB tune --dtype $1 --d 64,128 --n $NS --causal both \
    --trials $TRIALS --time-budget $BUDGET --device $2 --summary-json $OUT/summary_$1_$2.json \
    > $OUT/tune_$1_$2.log 2>&1
}

t0=$(date +%s)
if [ "$PHASE" = A ]; then
  tune fp16 1 &
  CUDA_VISIBLE_DEVICES=0 bash bench/h200/gpu_tests.sh > $OUT/gpu_tiers.log 2>&1
  [ -f bench/h200/header_check.sh ] && CUDA_VISIBLE_DEVICES=0 FA3=1 timeout 150 bash bench/h200/header_check.sh > $OUT/header_check.log 2>&1
  wait
else
  tune bf16 0 & sleep 8; tune bf16 1 & wait
  echo "campaign wall $(( $(date +%s) - t0 )) s" >> $OUT/env_$PHASE.txt
  python3 bench/compare_sdpa.py --db $DB --dtype fp16 --n $NS --device 0 --families --out $OUT/cmp_fp16 > $OUT/cmp_fp16.log 2>&1 &
  python3 bench/compare_sdpa.py --db $DB --dtype bf16 --n $NS --device 1 --families --out $OUT/cmp_bf16 > $OUT/cmp_bf16.log 2>&1 &
  wait
fi
echo "phase $PHASE wall $(( $(date +%s) - t0 )) s" >> $OUT/env_$PHASE.txt
python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()" $DBFILE
cp $DBFILE $OUT/h200.db
tail -12 $OUT/tune_*_1.log; tail -25 $OUT/gpu_tiers.log 2>/dev/null; tail -5 $OUT/header_check.log 2>/dev/null
tail -40 $OUT/cmp_fp16/compare_sdpa.md 2>/dev/null; tail -40 $OUT/cmp_bf16/compare_sdpa.md 2>/dev/null
