#!/usr/bin/env bash
# Device run: compare_sdpa for fp16 (GPU 0) and bf16 (GPU 1) from a results DB, then an Nsight
# Compute profile of one tuned kernel. DBFILE=the SQLite results file; CONFIG, N: what to profile.
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache
DB=sqlite:///${DBFILE:?}
CONFIG=${CONFIG:-fa2_d128_fp16_causal_br128_bc64_w4_s1_swz}; N=${N:-8192}
mkdir -p $OUT/cmp; t0=$(date +%s)
python3 bench/compare_sdpa.py --db $DB --dtype fp16 --device 0 --out $OUT/cmp/fp16 > $OUT/cmp/fp16.log 2>&1 &
python3 bench/compare_sdpa.py --db $DB --dtype bf16 --device 1 --out $OUT/cmp/bf16 > $OUT/cmp/bf16.log 2>&1 &
wait; echo "compare wall $(( $(date +%s) - t0 )) s"
ncu --version | tail -1 > $OUT/cmp/ncu.txt
timeout 240 ncu -k regex:fa2_ --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section SchedulerStats \
  --section LaunchStats --section InstructionStats \
  python3 -m fa2tune.cli bench --config $CONFIG --n $N --target-ms 5 >> $OUT/cmp/ncu.txt 2>&1
echo "ncu rc $?"
tar czf $OUT/cmp.tgz -C $OUT cmp && rm -rf $OUT/cmp
