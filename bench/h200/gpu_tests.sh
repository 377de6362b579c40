#!/usr/bin/env bash
# Device run: GPU test tier + one bench. Usage: bash scratch/gpu_tests.sh (on the GPU machine)
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"  # results and logs land here
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $OUT/env.txt
nvcc --version | tail -2 >> $OUT/env.txt
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)" >> $OUT/env.txt
( time timeout 420 python3 -m pytest -m gpu -q -x --durations=15 tests/test_gpu_faults.py tests/test_gpu_kernels.py tests/test_worker_reference.py ) > $OUT/gpu_tests.log 2>&1
tail -40 $OUT/gpu_tests.log
timeout 120 python3 -m fa2tune.cli bench --config fa2_d128_fp16_full_br128_bc64_w4_s1_pad8 --n 4096 --sdpa > $OUT/bench.log 2>&1
cat $OUT/bench.log | tail -30
