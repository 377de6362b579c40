#!/usr/bin/env bash
# Device run for what 2026-12-01 left unverified or untuned (issue 13), in one call:
#   header    the header's varlen GPU test (fa3 _vl winners on sm_90a; the plain-sm_90 build
#             in the same process must fall back to fa2 after the prepare-cache fix) and the
#             dense header check (on_tuned_gpu now caches device names);
#   prefill   tune bench/h200/prefill_gqa_workload.yaml (GQA prefill, B 1/4/16, N 512-8192)
#             over fa2 and fa3, warm-started from the shipped two-family results, dump it
#             (ship as db/data/h200_results_prefill_gqa.json) and compare with SDPA;
# STAGES picks them (default both); PREFILL_DTYPE=fp16 or bf16 tunes half of the workload (one
# device call each fits the per-call limit). Logs and results under $OUT.
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
STAGES=${STAGES:-header prefill}
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache COLUMNS=160
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/env.txt
has() { [[ " $STAGES " == *" $1 "* ]]; }
fa2="python3 -m fa2tune.cli"
if has header; then
  timeout ${HEADER_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider -m gpu \
    -W ignore::DeprecationWarning tests/codegen/test_gpu_header_varlen.py > $OUT/gpu_header_varlen.log 2>&1
  tail -5 $OUT/gpu_header_varlen.log
  STAGES="shipped fa3" OUT=$OUT timeout ${HEADER_CHECK_TIMEOUT:-240} bash bench/h200/header_check.sh \
    > $OUT/header_check.log 2>&1
  tail -5 $OUT/header_check.log
fi
if has prefill; then
  dt=${PREFILL_DTYPE:-both}
  sed "s/dtype: both/dtype: $dt/" bench/h200/prefill_gqa_workload.yaml > $OUT/workload_$dt.yaml
  ( export FA2TUNE_DB_URL=sqlite:////tmp/prefill_gqa_$dt.db
    time timeout ${PREFILL_TIMEOUT:-420} $fa2 tune --workload $OUT/workload_$dt.yaml \
      --family fa2,fa3 --warm-start db/data/h200_results_families.json --trials ${TRIALS:-16} \
      --target-ms 50 --summary-json $OUT/prefill_gqa_summary_$dt.json
    $fa2 dump -o $OUT/h200_results_prefill_gqa_$dt.json
    [ $dt = both ] && dts="fp16 bf16" || dts=$dt
    for t in $dts; do for b in 1 4 16; do
      timeout 120 python3 bench/compare_sdpa.py --db "$FA2TUNE_DB_URL" --d 128 --n 512,1024,2048,8192 \
        --batch $b --heads 32 --kv-heads 8 --dtype $t --causal yes --out $OUT/prefill_compare_${t}_b$b
    done; done ) > $OUT/prefill_gqa_$dt.log 2>&1
  tail -40 $OUT/prefill_gqa_$dt.log
fi
