#!/usr/bin/env bash
# Device run: GPU test tiers given in TIERS (pytest files; TIER_MARK the marker expression,
# default "gpu"), then the torch op's overhead benchmark and the torch example. Logs under $OUT.
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu_tiers.log
for t in ${TIERS:-tests/families/splitkv/test_gpu.py tests/fa2tune/test_gpu_torch_op.py}; do
  name=$(echo "${t%.py}" | tr / _)  # tests/families/fa3/test_gpu.py: tests_families_fa3_test_gpu
  timeout ${TIER_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -W ignore -m "${TIER_MARK:-gpu}" $t > $OUT/$name.log 2>&1
  echo "$name: $(tail -1 $OUT/$name.log)" | tee -a $OUT/gpu_tiers.log
done
if [ "${OVERHEAD:-1}" = 1 ]; then
  timeout 120 python3 bench/torch_op_overhead.py > $OUT/torch_op_overhead.log 2>&1; tail -25 $OUT/torch_op_overhead.log
fi
if [ "${EXAMPLE:-1}" = 1 ]; then
  timeout 180 python3 examples/torch_attention.py > $OUT/torch_example.log 2>&1; tail -20 $OUT/torch_example.log
fi
