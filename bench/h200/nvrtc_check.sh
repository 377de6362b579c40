#!/usr/bin/env bash
# Device run for issue 26 item 2 (no CUDA toolkit needed): GPU tiers with nvcc hidden (every
# kernel built by NVRTC from the wheels torch brings), then bench/nvrtc_vs_nvcc.py (the same
# shipped winners built by both, results and speed side by side). Logs under $OUT.
#
#   bash bench/h200/nvrtc_check.sh
#
# TIERS: the GPU test files to run with nvcc hidden. BENCH=0 skips the comparison.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/nvrtc.log"
python3 -c "from codegen.nvrtc_compile import nvrtc_release; print('NVRTC:', nvrtc_release())" 2>&1 | tee -a "$OUT/nvrtc.log"
nvcc --version | tail -2 | tee -a "$OUT/nvrtc.log"
tiers=${TIERS:-"tests/fa2tune/test_gpu_torch_kvcache.py tests/fa2tune/test_gpu_torch_op.py"}
for t in $tiers; do
  name=$(echo "${t%.py}" | tr / _)
  FA2TUNE_NVCC=/nonexistent/nvcc FA2TUNE_COMPILER=auto FA2TUNE_CACHE_DIR=/tmp/nvrtc-cache \
    timeout "${TIER_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -W ignore -m gpu \
    -rfEs "$t" > "$OUT/nvrtc_$name.log" 2>&1 &
done
wait
for t in $tiers; do
  name=$(echo "${t%.py}" | tr / _)
  echo "nvrtc_$name: $(tail -1 "$OUT/nvrtc_$name.log")" | tee -a "$OUT/nvrtc.log"
done
grep -h "compiling with NVRTC" "$OUT"/nvrtc_tests_*.log | head -2 | tee -a "$OUT/nvrtc.log"
if [ "${BENCH:-1}" = 1 ]; then
  timeout "${BENCH_TIMEOUT:-240}" python3 bench/nvrtc_vs_nvcc.py --out /tmp/nvrtc-bench \
    > "$OUT/nvrtc_vs_nvcc.log" 2>&1
  cp /tmp/nvrtc-bench/nvrtc_vs_nvcc.json "$OUT/" 2>/dev/null
  grep "NVRTC/nvcc\|Error\|error" "$OUT/nvrtc_vs_nvcc.log" | tail -20
fi
