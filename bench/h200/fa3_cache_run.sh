#!/usr/bin/env bash
# Device run (1xH200, one call of at most 10 minutes): the Hopper family's KV-cache kernels
# from correctness to shipped results, for chunked prefill (issue 24).
#   1. the GPU tiers: the worker's (tests/families/fa3/test_gpu_cache.py) and the op's
#      FA2TUNE_FA3_CACHE path (test_hopper_cache_kernels_match_the_torch_path);
#   2. the chunked prefills of the serving workload tuned on the Hopper family's cache
#      kernels (bench/h200/chunked_prefill_workload.yaml; BUDGET, default 5m; TRIALS, 8);
#   3. bench/kvcache_targets.py --rows chunked on that database (the op re-times the tuned
#      fa3 picks in its hopper columns, beside split-KV's cache kernels and the dense kernel).
#
#   bash bench/h200/fa3_cache_run.sh
#
# Writes under $OUT: tiers.log, tune.log, summary.json, fa3_cache_results.json (fa2tune dump
# of the campaign), kvcache_targets.{json,log}, env.txt.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache COLUMNS=160
DBFILE=/tmp/fa3_cache.db; DB=sqlite:///$DBFILE
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$OUT/env.txt"
git rev-parse HEAD >> "$OUT/env.txt" 2>/dev/null
# TIERS=0 skips step 1 (when an earlier call of the same session ran the tiers).
if [ "${TIERS:-1}" != 0 ]; then
timeout "${TIER_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider -W ignore -m gpu -rfEs \
  tests/families/fa3/test_gpu_cache.py tests/fa2tune/test_gpu_torch_kvcache.py -k "fa3 or hopper" \
  > "$OUT/tiers.log" 2>&1
echo "tiers: $(tail -1 "$OUT/tiers.log")" | tee -a "$OUT/env.txt"
fi
python3 -m fa2tune.cli --db "$DB" tune --family fa3 \
  --workload bench/h200/chunked_prefill_workload.yaml --trials "${TRIALS:-8}" \
  --time-budget "${BUDGET:-5m}" --summary-json "$OUT/summary.json" > "$OUT/tune.log" 2>&1
echo "tune exit $?" | tee -a "$OUT/env.txt"
python3 -m fa2tune.cli --db "$DB" dump -o "$OUT/fa3_cache_results.json" >> "$OUT/env.txt" 2>&1
FA2TUNE_DB_URL=$DB timeout "${BENCH_TIMEOUT:-180}" python3 bench/kvcache_targets.py --rows chunked \
  --out "$OUT" > "$OUT/kvcache_targets.log" 2>&1
echo "bench exit $?" | tee -a "$OUT/env.txt"
tail -3 "$OUT/kvcache_targets.log"
sed -i "s#$PWD#<tree>#g; s#/tmp/site#<site>#g; s#$OUT#<out>#g" "$OUT"/*.log "$OUT/env.txt"
