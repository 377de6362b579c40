#!/usr/bin/env bash
# Device run: the split-KV family's CPU/compile/GPU tiers, then the decode benchmark.
# Usage (on the GPU machine, repository root): bash bench/h200/splitkv_run.sh
# FULL=1 adds the whole-space GPU test for D=128 fp16.
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache
logs=/tmp/splitkv_logs; mkdir -p $logs
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $logs/env.txt
nvcc --version | tail -2 >> $logs/env.txt
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)" >> $logs/env.txt
sel="not slow"; [ "${FULL:-0}" = 1 ] && sel="gpu"
( time timeout ${TEST_TIMEOUT:-300} python3 -m pytest -m "$sel" -q -p no:cacheprovider -x --durations=10 tests/families/splitkv/test_splitkv.py tests/families/splitkv/test_gpu.py ) > $logs/gpu_tests_splitkv.log 2>&1
tail -25 $logs/gpu_tests_splitkv.log
if [ "${BENCH:-1}" = 1 ]; then
  ( time timeout ${BENCH_TIMEOUT:-300} python3 bench/decode_bench.py --out $logs/decode ${BENCH_ARGS:-} ) > $logs/decode_bench.log 2>&1
  tail -30 $logs/decode_bench.log
fi
tar czf $OUT/splitkv_logs.tgz -C /tmp splitkv_logs
