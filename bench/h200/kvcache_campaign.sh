#!/usr/bin/env bash
# Device run: tune a family's KV-cache kernels (`kv_page` problems) of a workload (FAMILY,
# default splitkv; fa3 for chunked prefill: bench/h200/chunked_prefill_workload.yaml) on a
# 1xH200 host, resumable across calls: the SQLite file comes back under $OUT and goes in
# again as DBIN, and a rerun of the same command continues the studies it holds.
#
#   WORKLOAD=examples/workloads/llama3_8b_serving.yaml BUDGET=8m bash bench/h200/kvcache_campaign.sh
#   DBIN=<the last call's kvcache.db> WORKLOAD=... bash bench/h200/kvcache_campaign.sh   # next call
#
# WORKLOAD (default the Llama 3 8B serving workload), TRIALS per problem (default 8), BUDGET
# for the call's campaign (default 8m: one device call is 10 minutes at most). Writes under
# $OUT: kvcache.db (the campaign's database, checkpointed), kvcache_results.json (fa2tune dump
# of it: the campaign's measurements only, since nothing here loads the shipped results into
# it; a `fa2tune best` on the same --db would), tune.log, summary.json, env.txt.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache COLUMNS=160
DBFILE=/tmp/kvcache.db; DB=sqlite:///$DBFILE
[ -n "${DBIN:-}" ] && cp "$DBIN" "$DBFILE"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$OUT/env.txt"
nvcc --version | tail -1 >> "$OUT/env.txt"
# WARM: a results file to start from (a cache problem also takes the dense shape's winners
# there as cache twins: for fa3, the shipped prefill results).
warm=(); [ -n "${WARM:-}" ] && warm=(--warm-start "$WARM")
python3 -m fa2tune.cli --db "$DB" tune --family "${FAMILY:-splitkv}" "${warm[@]}" \
  --workload "${WORKLOAD:-examples/workloads/llama3_8b_serving.yaml}" \
  --trials "${TRIALS:-8}" --time-budget "${BUDGET:-8m}" --summary-json "$OUT/summary.json" \
  > "$OUT/tune.log" 2>&1
echo "tune exit $?" | tee -a "$OUT/env.txt"
python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()" "$DBFILE"
cp "$DBFILE" "$OUT/kvcache.db"
python3 -m fa2tune.cli --db "$DB" dump -o "$OUT/kvcache_results.json" >> "$OUT/env.txt" 2>&1
tail -25 "$OUT/tune.log"
sed -i "s#$PWD#<tree>#g; s#/tmp/site#<site>#g" "$OUT/tune.log" "$OUT/env.txt"
