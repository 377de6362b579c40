#!/usr/bin/env bash
# Device run (1xH200, one call of at most 10 minutes): the cache problems tuned on a length mix
# (`kv_lengths: mixed`, core/kv_lengths.py), then the KV-cache targets re-timed on the op's
# picks with them shipped:
#   1. bench/h200/kvcache_campaign.sh on bench/h200/decode_mixed_workload.yaml (15 problems),
#      warm-started from the shipped full-length cache results (their picks are trials);
#   2. the campaign's dump placed as db/data/h200_results_kvcache_mixed.json in this tree
#      and bench/kvcache_targets.py --rows decode,mixed on a fresh op database (so the op loads
#      it with the other shipped files and answers decode cache calls from it first).
#
#   bash bench/h200/mixed_run.sh
#   TIER=1 WARM=db/data/h200_results_kvcache_mixed.json bash bench/h200/mixed_run.sh
#
# TIER=1 first runs the worker's KV-cache GPU tier (tests/measure/test_gpu_kvcache.py: both
# split spans, cap_split, on full and mixed lengths) into $OUT/gpu_tier.log. WARM (default the
# full-length results) is the file the campaign starts from. TRIALS (default 8), BUDGET
# (default 5m). Writes under $OUT: kvcache.db, kvcache_results.json,
# tune.log, summary.json, env.txt (the campaign's), targets/kvcache_targets.{json,log}.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ "${TIER:-0}" = 1 ]; then
  if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
  PYTHONPATH=/tmp/site:$PWD FA2TUNE_CACHE_DIR=/tmp/fa2cache timeout "${TIER_TIMEOUT:-240}" \
    python3 -m pytest -q -p no:cacheprovider -W ignore -m gpu -rfEs tests/measure/test_gpu_kvcache.py \
    > "$OUT/gpu_tier.log" 2>&1
  tail -1 "$OUT/gpu_tier.log"
  sed -i "s#$PWD#<tree>#g; s#/tmp/site#<site>#g" "$OUT/gpu_tier.log"
fi
WORKLOAD=bench/h200/decode_mixed_workload.yaml WARM=${WARM:-db/data/h200_results_kvcache.json} \
  TRIALS=${TRIALS:-8} BUDGET=${BUDGET:-5m} OUT="$OUT" bash bench/h200/kvcache_campaign.sh
[ -s "$OUT/kvcache_results.json" ] || { echo "no dump: nothing to re-time"; exit 1; }
cp "$OUT/kvcache_results.json" db/data/h200_results_kvcache_mixed.json
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache
mkdir -p "$OUT/targets"
FA2TUNE_PRINT_CHOICE=1 FA2TUNE_DB_URL=sqlite:////tmp/op_mixed.db timeout "${TARGETS_TIMEOUT:-150}" \
  python3 bench/kvcache_targets.py --rows decode,mixed --out "$OUT/targets" \
  > "$OUT/targets/kvcache_targets.log" 2>&1
echo "targets exit $?" >> "$OUT/env.txt"
grep "^kvcache_targets:" "$OUT/targets/kvcache_targets.log"
sed -i "s#$PWD#<tree>#g; s#/tmp/site#<site>#g; s#$OUT#<out>#g" "$OUT/targets/kvcache_targets.log" "$OUT/env.txt"
