#!/usr/bin/env bash
# Device run for issue 23's shipped results: one campaign over the four variant workloads
# (Mistral-7B, Gemma-2-9B, GPT-OSS-20B, Llama-4-Scout; prefill and decode) plus the plain
# causal problem at Mistral's prefill shape (what bench/variants_vs_flex.py sets the windowed
# prefill beside), every family that serves each problem, one SQLite file; then fa2tune dump.
#
#   TRIALS=12 BUDGET=7m30s bash bench/h200/variants_campaign.sh
#
# WORKLOADS: the workload files instead (space-separated); GRID=0 leaves the plain causal
# problem out; BENCH=1 then runs bench/variants_vs_flex.py on this database (and the shipped
# results) alone on the GPU, REPS timings per case.
#
# Logs, summary and the results file ($OUT/h200_results_variants.json) under $OUT.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache COLUMNS=160
DBFILE=/tmp/variants.db; export FA2TUNE_DB_URL=sqlite:///$DBFILE
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/env.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >> "$OUT/env.txt"
workloads=()
default_workloads="examples/workloads/mistral_7b.yaml examples/workloads/gemma2_9b.yaml
  examples/workloads/gpt_oss_20b.yaml examples/workloads/llama4_scout.yaml"
for w in ${WORKLOADS:-$default_workloads}; do workloads+=(--workload "$w"); done
grid=(--d 128 --n 16384,32768 --batch 1 --heads 32 --kv-heads 8 --dtype bf16 --causal yes)
[ "${GRID:-1}" = 0 ] && grid=()
( time timeout "${TUNE_TIMEOUT:-540}" python3 -m fa2tune.cli tune "${workloads[@]}" "${grid[@]}" \
    --trials "${TRIALS:-12}" --time-budget "${BUDGET:-7m30s}" --target-ms "${TARGET_MS:-50}" \
    --summary-json "$OUT/variants_summary.json" ) > "$OUT/variants_tune.log" 2>&1
python3 -m fa2tune.cli dump -o "$OUT/h200_results_variants.json" > "$OUT/dump.log" 2>&1
tail -2 "$OUT/dump.log"; tail -60 "$OUT/variants_tune.log"
if [ "${BENCH:-0}" = 1 ]; then
  timeout "${BENCH_TIMEOUT:-240}" python3 bench/variants_vs_flex.py --reps "${REPS:-20}" \
    > "$OUT/variants_vs_flex.log" 2>&1
  grep '^|' "$OUT/variants_vs_flex.log"
fi
