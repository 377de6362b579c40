#!/usr/bin/env bash
# Device run: GPU test tier (fa2, then fa3) + one bench. Usage: bash bench/h200/gpu_tests.sh (on the GPU machine)
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"  # results and logs land here
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $OUT/env.txt
nvcc --version | tail -2 >> $OUT/env.txt
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)" >> $OUT/env.txt
( time timeout 420 python3 -m pytest -m gpu -q -x --durations=15 tests/measure/test_gpu_faults.py tests/families/fa2/test_gpu.py tests/measure/test_worker_reference.py ) > $OUT/gpu_tests.log 2>&1
tail -40 $OUT/gpu_tests.log
# The Hopper family (fa3) through the product: compile tier, GPU tier (worker path, sampled
# space; the whole-space test is `slow`: bash bench/h200/fa3_check.sh with FULL=1).
( time timeout 480 python3 -m pytest -m "not slow" -q -p no:cacheprovider --durations=10 tests/families/fa3/test_host.py tests/families/fa3/test_compile.py tests/families/fa3/test_gpu.py ) > $OUT/gpu_tests_fa3.log 2>&1
tail -30 $OUT/gpu_tests_fa3.log
timeout 120 python3 -m fa2tune.cli bench --config fa2_d128_fp16_full_br128_bc64_w4_s1_pad8 --n 4096 --sdpa > $OUT/bench.log 2>&1
cat $OUT/bench.log | tail -30
