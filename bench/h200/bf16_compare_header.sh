#!/usr/bin/env bash
# Device run: bf16 campaign on 2 GPUs (resuming the fp16 DB), header GPU check in the background,
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"  # results and logs land here
# then tuned-vs-SDPA comparison (fp16 on GPU 0, bf16 on GPU 1).
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache COLUMNS=160
cp ${SEED_DB:-h200.db} /tmp/h200.db; DB=sqlite:////tmp/h200.db
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv | tee $OUT/env.txt
# header check (CPU compile overlaps the GPU work)
( set -x; python3 -m fa2tune.cli --db $DB export --gpu H200 --d 64,128 --dtype fp16 -o /tmp/fa2_tuned.cuh &&
  time nvcc -std=c++17 -O2 -gencode=arch=compute_90,code=sm_90 -I/tmp -DFA2TUNE_HEADER='"fa2_tuned.cuh"' examples/fa2_example.cu -o /tmp/fa2_example &&
  CUDA_VISIBLE_DEVICES=0 /tmp/fa2_example --d 64,128 --n 1,100,1000,4096 --causal 0,1 --dtype fp16 ) > $OUT/header_check.log 2>&1 &
hdr=$!
start=$(date +%s)
for d in 64 128; do for c in "" --causal; do
  python3 -m fa2tune.cli build --d $d --dtype bf16 $c --jobs 28 2>&1 | tail -1
done; done | tee $OUT/precompile_bf16.txt
echo "precompile $(( $(date +%s) - start )) s" | tee -a $OUT/precompile_bf16.txt
t0=$(date +%s); pids=()
for dev in 0 1; do
  ( time timeout ${LIMIT:-270} python3 -m fa2tune.cli --db $DB tune --dtype bf16 --trials ${TRIALS:-20} --device $dev \
      --summary-json $OUT/summary_bf16_$dev.json ) > $OUT/tune_bf16_$dev.log 2>&1 &
  pids+=($!); sleep 8
done
wait "${pids[@]}"
echo "bf16 campaign wall $(( $(date +%s) - t0 )) s" | tee -a $OUT/precompile_bf16.txt
mkdir -p /tmp/cmp0 /tmp/cmp1
python3 bench/compare_sdpa.py --db $DB --dtype fp16 --device 0 --out /tmp/cmp0 > /tmp/cmp0/log 2>&1 &
python3 bench/compare_sdpa.py --db $DB --dtype bf16 --device 1 --out /tmp/cmp1 > /tmp/cmp1/log 2>&1 &
wait
python3 -c "import sqlite3; c=sqlite3.connect('/tmp/h200.db'); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()"
python3 -m fa2tune.cli --db $DB dump -o $OUT/h200_results.json 2>&1 | tail -1
tar czf $OUT/cmp.tgz -C /tmp cmp0 cmp1 && cp /tmp/h200.db $OUT/h200.db
tail -30 $OUT/tune_bf16_0.log | cut -c1-150; tail -12 $OUT/header_check.log; cat /tmp/cmp0/compare_sdpa.md /tmp/cmp1/compare_sdpa.md | cut -d'|' -f2-5,8-14; tail -3 /tmp/cmp0/log /tmp/cmp1/log
