#!/usr/bin/env bash
# Device run for issue 23 (attention variants): the variant GPU tiers of every family and the
# torch op in parallel, FlashAttention-3's forward tests through fa2tune.flash_attn on a
# deterministic sample, then (alone on the GPU) bench/variants_vs_flex.py. Logs under $OUT.
#
#   PEER=.peer/flash-attention bash bench/h200/variants_check.sh
#
# PEER: a copy of ../shared/peer/flash-attention inside the checkout (carried to the device);
# PEER_WHERE (FA2TUNE_PEER_WHERE) and PEER_ARGS (pytest arguments, e.g. -k test_flash_attn_output)
# narrow its items. TIERS: the GPU test files to run (default: the five variant tiers; "none"
# for none, e.g. to time alone after a campaign). BENCH=0 skips the FlexAttention comparison.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/variants.log"
tiers=${TIERS:-"tests/families/fa2/test_variant_gpu.py tests/families/splitkv/test_variant_gpu.py
       tests/families/fa3/test_variant_gpu.py tests/measure/test_gpu_variants.py
       tests/fa2tune/test_gpu_torch_variants.py"}
[ "$tiers" = none ] && tiers=""
for t in $tiers; do
  name=$(echo "${t%.py}" | tr / _)
  timeout "${TIER_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -W ignore -m gpu "$t" \
    > "$OUT/$name.log" 2>&1 &
done
if [ -n "${PEER:-}" ]; then
  # SIGINT at the limit: pytest stops and still writes the summary of what ran.
  # shellcheck disable=SC2086  # PEER_ARGS is a word list on purpose
  FA2TUNE_PEER_EVERY=${PEER_EVERY:-200} FA2TUNE_PEER_WORKERS=${PEER_WORKERS:-4} \
    FA2TUNE_PEER_WHERE=${PEER_WHERE:-} timeout -s INT -k 30 "${PEER_TIMEOUT:-${TIER_TIMEOUT:-300}}" \
    bash bench/peer/run_fa3_tests.sh "$PEER" ${PEER_ARGS:-} > "$OUT/peer.log" 2>&1 &
fi
wait
for t in $tiers; do
  name=$(echo "${t%.py}" | tr / _)
  echo "$name: $(tail -1 "$OUT/$name.log")" | tee -a "$OUT/variants.log"
done
[ -f "$OUT/peer/summary.txt" ] && cat "$OUT/peer/summary.txt" | tee -a "$OUT/variants.log"
if [ "${BENCH:-1}" = 1 ]; then
  timeout "${BENCH_TIMEOUT:-200}" python3 bench/variants_vs_flex.py --reps "${REPS:-10}" \
    > "$OUT/variants_vs_flex.log" 2>&1
  tail -15 "$OUT/variants_vs_flex.log"
fi
