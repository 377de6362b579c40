#!/usr/bin/env bash
# Device run after the variant campaign (issue 23), one SQLite file under /tmp:
#   0. GPU_TESTS (pytest files of GPU tests, e.g. the header's variant tier), then the decode
#      bench (BENCH_ONLY), then OVERHEAD=1: bench/torch_op_overhead.py --growing;
#   1. plain shipped winners re-timed on this tree (warm start, one trial each): the
#      two-family file's D 64/128 at N 1k/4k/16k (fp16/bf16, causal and not) and the decode
#      workload, each compared with its shipped time by bench/retime_vs_shipped.py;
#   2. Mistral's windowed decode at B=8 searched further (DECODE_TRIALS trials, split-KV);
# Logs under $OUT.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache COLUMNS=160
export FA2TUNE_DB_URL=sqlite:////tmp/followup.db
fa2="python3 -m fa2tune.cli"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/env.txt"
for t in ${GPU_TESTS:-}; do
  name=$(echo "${t%.py}" | tr / _)
  timeout 200 python3 -m pytest -q -p no:cacheprovider -W ignore -m gpu "$t" > "$OUT/$name.log" 2>&1
  echo "$name: $(tail -1 "$OUT/$name.log")"
done
if [ -n "${BENCH_ONLY:-}" ]; then
  timeout 150 python3 bench/variants_vs_flex.py --reps 20 --only "$BENCH_ONLY" \
    > "$OUT/variants_vs_flex.log" 2>&1
  grep '^|' "$OUT/variants_vs_flex.log"
fi
if [ "${OVERHEAD:-0}" = 1 ]; then
  timeout 120 python3 bench/torch_op_overhead.py --family splitkv --growing 400 \
    > "$OUT/torch_op_overhead.log" 2>&1
  grep '^|' "$OUT/torch_op_overhead.log" | tail -12
fi
if [ "${RETIME:-1}" = 1 ]; then
  # A database of its own: the op above loaded the shipped results into FA2TUNE_DB_URL's,
  # and a campaign reuses stored measurements instead of timing them again.
  timeout 200 $fa2 --db sqlite:////tmp/retime.db tune --d 64,128 --n 1024,4096,16384 --dtype fp16,bf16 --causal no,yes \
    --family fa2,fa3 --warm-start db/data/h200_results_families.json --warm-start-top 1 \
    --trials 1 --target-ms 100 --summary-json "$OUT/retime_prefill.json" > "$OUT/retime_prefill.log" 2>&1
  timeout 120 $fa2 --db sqlite:////tmp/retime.db tune --workload bench/h200/decode_workload.yaml --family splitkv \
    --warm-start db/data/h200_results_decode.json --warm-start-top 1 --trials 1 --target-ms 30 \
    --summary-json "$OUT/retime_decode.json" > "$OUT/retime_decode.log" 2>&1
  python3 bench/retime_vs_shipped.py "$OUT/retime_prefill.json" db/data/h200_results_families.json \
    > "$OUT/retime_prefill.md" 2>&1; tail -1 "$OUT/retime_prefill.md"
  python3 bench/retime_vs_shipped.py "$OUT/retime_decode.json" db/data/h200_results_decode.json \
    > "$OUT/retime_decode.md" 2>&1; tail -1 "$OUT/retime_decode.md"
fi
if [ "${DECODE_TRIALS:-0}" -gt 0 ]; then
  timeout 150 $fa2 --db sqlite:////tmp/retime.db tune --d 128 --nq 1 --nk 32768 --batch 8 --heads 32 --kv-heads 8 \
    --dtype bf16 --causal no --window 4096,-1 --family splitkv --trials "$DECODE_TRIALS" \
    --target-ms 30 --summary-json "$OUT/decode_b8.json" > "$OUT/decode_b8.log" 2>&1
  tail -8 "$OUT/decode_b8.log"
fi
$fa2 --db sqlite:////tmp/retime.db dump -o "$OUT/followup_results.json" > "$OUT/dump.log" 2>&1; tail -1 "$OUT/dump.log"
