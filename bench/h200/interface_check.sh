#!/usr/bin/env bash
# Device run (1xH200, one call of at most 10 minutes): what the FlashAttention-compatible
# interface gained on the CPU on 2026-12-04 and has not run on a GPU yet, each step alone on
# the GPU (a step beside another ran out of memory on 2026-12-04):
#   1. the KV-cache GPU tier (its left-padded paged cases: a gathered contiguous copy; packed
#      queries and new keys) and the varlen tier (seqused_q / seqused_k);
#   2. FlashAttention-3's test_flash_attn_kvcache items with packed queries (`varlen_q`:
#      cu_seqlens_q / cu_seqlens_k_new through right-aligned padding) and the paged
#      left-padded ones, every PEER_EVERY-th (default 6);
#   3. its test_flash_attn_varlen_output items (seqused_q / seqused_k), every VARLEN_EVERY-th
#      (default 40);
#   4. the split-KV plain tier (tests/families/splitkv/test_gpu.py), cut short on 2026-12-04.
# Needs a copy of ../shared/peer/flash-attention at .peer/flash-attention (carried).
#
#   bash bench/h200/interface_check.sh
#   STEPS="kvcache_tier splitkv_tier" bash bench/h200/interface_check.sh   # some steps only
#
# Writes under $OUT: kvcache_tier.log, varlen_tier.log, peer_kvcache/ and peer_varlen/ (summary.{txt,json}),
# splitkv_tier.log, env.txt.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache
PEER=${PEER:-.peer/flash-attention}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
git rev-parse HEAD >> "$OUT/env.txt" 2>/dev/null
tier() {  # tier NAME FILE TIMEOUT
  timeout "$3" python3 -m pytest -q -p no:cacheprovider -W ignore -m gpu -rfEs "$2" \
    > "$OUT/$1.log" 2>&1
  echo "$1: $(tail -1 "$OUT/$1.log")" | tee -a "$OUT/env.txt"
}
peer() {  # peer NAME EVERY WHERE TEST TIMEOUT
  FA2TUNE_PEER_OUT="$OUT/$1" FA2TUNE_PEER_EVERY=$2 FA2TUNE_PEER_WORKERS=${PEER_WORKERS:-4} \
    FA2TUNE_PEER_WHERE=$3 timeout -s INT -k 30 "$5" bash bench/peer/run_fa3_tests.sh "$PEER" \
    -k "$4" > "$OUT/$1.log" 2>&1
  rm -f "$OUT/$1/pytest.log"
  tee -a "$OUT/env.txt" < "$OUT/$1/summary.txt"
}
STEPS=${STEPS:-kvcache_tier varlen_tier peer_kvcache peer_varlen splitkv_tier}
for step in $STEPS; do
  case $step in
    kvcache_tier) tier kvcache_tier tests/fa2tune/test_gpu_torch_kvcache.py "${TIER_TIMEOUT:-150}" ;;
    varlen_tier) tier varlen_tier tests/fa2tune/test_gpu_torch_varlen.py "${TIER_TIMEOUT:-150}" ;;
    peer_kvcache) peer peer_kvcache "${PEER_EVERY:-6}" "varlen_q or (has_leftpad and page_size)" \
      test_flash_attn_kvcache "${PEER_TIMEOUT:-150}" ;;
    peer_varlen) peer peer_varlen "${VARLEN_EVERY:-40}" "" test_flash_attn_varlen_output \
      "${PEER_TIMEOUT:-150}" ;;
    splitkv_tier) tier splitkv_tier tests/families/splitkv/test_gpu.py "${SPLITKV_TIMEOUT:-120}" ;;
    *) echo "unknown step: $step" >&2; exit 2 ;;
  esac
done
sed -i "s#$PWD#<tree>#g; s#/tmp/site#<site>#g; s#$OUT#<out>#g" "$OUT"/*.log "$OUT/env.txt"
