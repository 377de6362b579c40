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

tune() {  # dtype device [d list] [n list] [budget]
  python3 -m fa2tune.cli --db $DB tune --dtype $1 --d ${3:-64,128} --n ${4:-$NS} --causal both \
    --trials $TRIALS --time-budget ${5:-$BUDGET} --device $2 \
    --summary-json $OUT/summary_$1_$2${3:+_d$3}.json > $OUT/tune_$1_$2${3:+_d$3}.log 2>&1
}

t0=$(date +%s)
if [ "$PHASE" = A ]; then
  tune fp16 1 &
  # Correctness tiers on GPU 0, the two families side by side (timing is not asserted).
  ( CUDA_VISIBLE_DEVICES=0 timeout 400 python3 -m pytest -m gpu -q -p no:cacheprovider -x \
      tests/measure/test_gpu_faults.py tests/families/fa2/test_gpu.py tests/measure/test_worker_reference.py ) > $OUT/gpu_fa2.log 2>&1 &
  p2=$!
  ( CUDA_VISIBLE_DEVICES=0 timeout 400 python3 -m pytest -m "not slow" -q -p no:cacheprovider \
      tests/families/fa3/test_host.py tests/families/fa3/test_compile.py tests/families/fa3/test_gpu.py ) > $OUT/gpu_fa3.log 2>&1 &
  p3=$!
  wait $p2 $p3
  [ -f bench/h200/header_check.sh ] && CUDA_VISIBLE_DEVICES=0 FA3=1 timeout 120 bash bench/h200/header_check.sh > $OUT/header_check.log 2>&1
  wait
else
  tune bf16 0 & sleep 8; tune bf16 1 & wait
  echo "campaign wall $(( $(date +%s) - t0 )) s" >> $OUT/env_$PHASE.txt
  # D=256, both dtypes, two lengths (a short budget: few problems, long kernels).
  tune fp16 0 256 4096,16384 75s & tune bf16 1 256 4096,16384 75s & wait
  for dt in fp16 bf16; do
    dev=$([ $dt = fp16 ] && echo 0 || echo 1)
    ( python3 bench/compare_sdpa.py --db $DB --dtype $dt --n $NS --device $dev --families --out $OUT/cmp_$dt
      python3 bench/compare_sdpa.py --db $DB --dtype $dt --d 256 --n 4096,16384 --device $dev --families --out $OUT/cmp256_$dt
    ) > $OUT/cmp_$dt.log 2>&1 &
  done
  wait
fi
echo "phase $PHASE wall $(( $(date +%s) - t0 )) s" >> $OUT/env_$PHASE.txt
python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()" $DBFILE
cp $DBFILE $OUT/h200.db
tail -12 $OUT/tune_*_1.log; tail -8 $OUT/gpu_fa2.log $OUT/gpu_fa3.log 2>/dev/null; tail -5 $OUT/header_check.log 2>/dev/null
tail -40 $OUT/cmp_fp16/compare_sdpa.md 2>/dev/null; tail -40 $OUT/cmp_bf16/compare_sdpa.md 2>/dev/null
tail -6 $OUT/cmp256_fp16/compare_sdpa.md $OUT/cmp256_bf16/compare_sdpa.md 2>/dev/null
# At most 8 files come back from a device call: everything but the DB goes into one archive.
# (Written outside $OUT first: tar warns, and fails, when its own output changes under it.)
( cd $OUT && tar czf /tmp/all_$PHASE.tgz --exclude=h200.db . \
  && find . -mindepth 1 -maxdepth 1 ! -name h200.db -exec rm -rf {} + && mv /tmp/all_$PHASE.tgz . )
