#!/usr/bin/env bash
# FlashAttention-3's own tests (hopper/test_flash_attn.py) against fa2tune.flash_attn.
#
#   bench/peer/run_fa3_tests.sh [PEER_DIR] [pytest args...]
#
# PEER_DIR holds test_flash_attn.py, test_util.py and padding.py (default
# ../shared/peer/flash-attention, from the project root). Run from the project root.
# The alias folder (bench/peer/alias: a one-line flash_attn_interface re-exporting
# fa2tune.flash_attn) comes first on sys.path, so the tests' `from flash_attn_interface import`
# gets fa2tune's functions; bench/peer/peer_plugin.py samples the items and writes a summary
# per test function (run, passed, failed, skipped, unsupported = NotImplementedError).
#
# Environment:
#   FA2TUNE_PEER_EVERY    run every N-th item of each test function (default 20)
#   FA2TUNE_PEER_OFFSET   from the item with this index (default 0)
#   FA2TUNE_PEER_WHERE    only items whose parameters pass this Python expression, e.g.
#                         "(local or softcap > 0) and d in (96, 128, 256)" (default: all)
#   FA2TUNE_PEER_OUT      where summary.json, summary.txt and pytest.log go (default
#                         $OUT/peer when $OUT is set, else peer-results)
#   FA2TUNE_PEER_WORKERS  pytest-xdist workers when xdist is installed (default 4; 0: none)
#   PYTHON                the interpreter (default python3)
# Needs torch, pytest and einops (the tests import it); pytest-xdist is used if present.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
peer="${1:-../shared/peer/flash-attention}"
[ $# -gt 0 ] && shift
python="${PYTHON:-python3}"
if [ ! -f "$peer/test_flash_attn.py" ]; then
  echo "run_fa3_tests.sh: no test_flash_attn.py in $peer (pass the peer folder)" >&2
  exit 2
fi
if ! "$python" -c "import einops" 2>/dev/null; then
  echo "run_fa3_tests.sh: the peer tests import einops, which $python does not have" >&2
  exit 2
fi
peer="$(cd "$peer" && pwd)"

if [ -n "${OUT:-}" ]; then default_out="$OUT/peer"; else default_out="$PWD/peer-results"; fi
export FA2TUNE_PEER_OUT="${FA2TUNE_PEER_OUT:-$default_out}"
export FA2TUNE_PEER_EVERY="${FA2TUNE_PEER_EVERY:-20}"
export FA2TUNE_PEER_OFFSET="${FA2TUNE_PEER_OFFSET:-0}"
mkdir -p "$FA2TUNE_PEER_OUT"

# What fa2tune.flash_attn does not run, told the way the tests ask: no backward, no fp8.
# Paged and appended KV caches, split-KV counts, pack-GQA, local windows, chunks, softcap,
# fp16 and every head dim stay on: num_splits and pack_gqa are hints, and the rest either runs
# or says NotImplementedError (counted as unsupported, with its reason: rotary embedding,
# left padding and packed queries over a cache, for one). Set FLASH_ATTENTION_DISABLE_LOCAL=TRUE
# / _SOFTCAP=TRUE / _PAGEDKV=TRUE / _APPENDKV=TRUE yourself to leave those out (the output
# tests try a random attention_chunk first in every item).
export FLASH_ATTENTION_DISABLE_BACKWARD=TRUE
export FLASH_ATTENTION_DISABLE_PAGEDKV="${FLASH_ATTENTION_DISABLE_PAGEDKV:-FALSE}"
export FLASH_ATTENTION_DISABLE_APPENDKV="${FLASH_ATTENTION_DISABLE_APPENDKV:-FALSE}"
export FLASH_ATTENTION_DISABLE_FP8=TRUE
# fa2tune logs each choice it makes (the plugin counts the kernel families that ran).
export FA2TUNE_PRINT_CHOICE=1

export PYTHONPATH="$root/bench/peer/alias:$root/bench/peer:$root${PYTHONPATH:+:$PYTHONPATH}"

args=(-p peer_plugin -p no:cacheprovider -q -rN)
workers="${FA2TUNE_PEER_WORKERS:-4}"
if [ "$workers" != 0 ] && "$python" -c "import xdist" 2>/dev/null; then
  args+=(-n "$workers")
fi

cd "$peer"
"$python" -m pytest "${args[@]}" "$@" test_flash_attn.py 2>&1 | tee "$FA2TUNE_PEER_OUT/pytest.log"
exit "${PIPESTATUS[0]}"
