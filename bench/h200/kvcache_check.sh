#!/usr/bin/env bash
# Device run for issue 24 (KV caches): the KV-cache GPU tier (kernels against the torch path,
# a captured graph over 1,000 growing decode steps, torch.compile, flash_attn_with_kvcache),
# the split-KV plain and variant tiers beside it (the template they share changed), then,
# alone on the GPU, bench/kvcache_bench.py. Logs under $OUT.
#
#   bash bench/h200/kvcache_check.sh
#
# TIERS: the GPU test files (default: the three above; "none" for none). BENCH=0 skips the
# bench; BENCH_ARGS are its extra arguments (--host-only: the host side alone). PEER: a copy
# of ../shared/peer/flash-attention inside the checkout: also runs its test_flash_attn_kvcache through fa2tune.flash_attn (PEER_ARGS narrows it, e.g. a -k filter).
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/kvcache.log"
tiers=${TIERS:-"tests/fa2tune/test_gpu_torch_kvcache.py tests/families/splitkv/test_gpu.py
       tests/families/splitkv/test_variant_gpu.py"}
[ "$tiers" = none ] && tiers=""
for t in $tiers; do
  name=$(echo "${t%.py}" | tr / _)
  timeout "${TIER_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -W ignore -m gpu \
    -rfEs "$t" > "$OUT/$name.log" 2>&1 &
done
if [ -n "${PEER:-}" ]; then
  # shellcheck disable=SC2086  # PEER_ARGS is a word list on purpose
  FA2TUNE_PEER_EVERY=${PEER_EVERY:-1} FA2TUNE_PEER_WORKERS=${PEER_WORKERS:-4} \
    FA2TUNE_PEER_WHERE=${PEER_WHERE:-} timeout -s INT -k 30 "${PEER_TIMEOUT:-300}" \
    bash bench/peer/run_fa3_tests.sh "$PEER" ${PEER_ARGS:-} > "$OUT/peer.log" 2>&1 &
fi
wait
for t in $tiers; do
  name=$(echo "${t%.py}" | tr / _)
  echo "$name: $(tail -1 "$OUT/$name.log")" | tee -a "$OUT/kvcache.log"
done
[ -f "$OUT/peer/summary.txt" ] && tee -a "$OUT/kvcache.log" < "$OUT/peer/summary.txt"
if [ "${BENCH:-1}" = 1 ]; then
  # shellcheck disable=SC2086  # BENCH_ARGS is a word list on purpose (e.g. --host-only)
  timeout "${BENCH_TIMEOUT:-240}" python3 bench/kvcache_bench.py --out "$OUT" ${BENCH_ARGS:-} \
    > "$OUT/kvcache_bench.log" 2>&1
  tail -12 "$OUT/kvcache_bench.log"
fi
