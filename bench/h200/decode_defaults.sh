#!/usr/bin/env bash
# Device run for issue 24's choice fixes: untuned decode calls on the split-KV default
# against FlashAttention-2's default (the rule fa2tune.ops.choice.default_config now
# applies to every decode step), the torch op's dense decode over the shipped results
# (bench/kvcache_bench.py's `dense` column: D=64 no longer takes a prefill tile), the torch
# op's GPU tier, and the host profile of steady decode calls (bench/host_profile.py).
#
#   bash bench/h200/decode_defaults.sh          # logs under $OUT
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache
log=$OUT/decode_defaults.log
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git rev-parse --short HEAD 2>/dev/null
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } > "$log"
# (batch, q heads, kv heads, D, keys): GQA and MHA decode steps that launch more query
# blocks than the GPU has SMs, where the old rule gave FlashAttention-2's default.
for shape in "16 64 8 64 8192" "64 32 8 128 4096" "8 32 8 128 16384" "64 32 32 128 4096"; do
  set -- $shape
  for cfg in "fa2_d$4_bf16_full_$( [ "$4" = 64 ] && echo br128_bc128 || echo br128_bc64 )_w4_s1_swz" \
             "splitkv_d$4_bf16_full_r16_n32_w4_s2_k16"; do
    echo "== B=$1 H=$2/$3 D=$4 Nk=$5 $cfg" >> "$log"
    timeout 180 python3 -m fa2tune.cli bench --config "$cfg" --n 1 --nk "$5" --batch "$1" \
      --heads "$2" --kv-heads "$3" --sdpa --json >> "$log" 2>&1 || echo "rc=$?" >> "$log"
  done
done
timeout 240 python3 bench/kvcache_bench.py --out "$OUT" > "$OUT/kvcache_bench.log" 2>&1
timeout 120 python3 bench/host_profile.py --out "$OUT" > "$OUT/host_profile.log" 2>&1
timeout 300 python3 -m pytest -q -p no:cacheprovider -W ignore -m gpu -rfEs \
  tests/fa2tune/test_gpu_torch_op.py > "$OUT/gpu_torch_op.log" 2>&1
tail -1 "$OUT/gpu_torch_op.log" >> "$log"
tail -12 "$OUT/kvcache_bench.log"; tail -3 "$OUT/host_profile.log"; tail -1 "$OUT/gpu_torch_op.log"
