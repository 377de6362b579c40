#!/usr/bin/env bash
# Device run: tune the Hopper family (fa3) on prefill problems the shipped campaign left
# without any fa3 measurement (its study spent the budget on fa2 there), starting each from
# the other 16-bit dtype's fa3 winners of the same shape (--warm-start-other-dtype), then
# dump the results as one shipped results file. One call on a 1xH200 host.
#
#   FILL="128:1024:fp16:no 64:1024:fp16:yes" bash bench/h200/fa3_fill.sh
#
# FILL: D:N:dtype:causal(no|yes) problems at batch 2, 16 heads (the README table's shapes);
# TRIALS per problem (default 16); BUDGET per problem (default 100s). Writes under $OUT:
# fill.json (fa2tune dump of the new measurements), tune_<D>_<N>_<dtype>_<causal>.log,
# summary_*.json, env.txt.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache COLUMNS=160
DBFILE=$(mktemp -d)/fill.db; DB=sqlite:///$DBFILE
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$OUT/env.txt"
nvcc --version | tail -1 >> "$OUT/env.txt"
WARM=db/data/h200_results_families.json
for p in ${FILL:?D:N:dtype:causal problems}; do
  IFS=: read -r d n dt causal <<< "$p"
  tag=${d}_${n}_${dt}_${causal}
  python3 -m fa2tune.cli --db "$DB" tune --family fa3 --d "$d" --n "$n" --dtype "$dt" \
    --causal "$causal" --trials "${TRIALS:-16}" --time-budget "${BUDGET:-100s}" \
    --warm-start "$WARM" --warm-start-other-dtype --summary-json "$OUT/summary_$tag.json" \
    > "$OUT/tune_$tag.log" 2>&1
  echo "$tag: $(tail -1 "$OUT/tune_$tag.log")" | tee -a "$OUT/env.txt"
done
python3 -m fa2tune.cli --db "$DB" dump -o "$OUT/fill.json" >> "$OUT/env.txt" 2>&1
sed -i "s#$PWD#<tree>#g; s#/tmp/site#<site>#g" "$OUT"/*.log "$OUT/env.txt"
