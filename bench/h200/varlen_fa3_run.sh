#!/usr/bin/env bash
# Device run (2026-12-01): the Hopper family's varlen kernels and the header's varlen entry.
# STAGES (default all): tests  GPU tests of varlen (fa2 and fa3 _vl configs, the worker) and of
#                              the exported header's fa2tune_forward_varlen;
#                       fa3    the dense fa3 tier (the template changed; every-config excluded);
#                       torch  bench/torch_op_overhead.py --breakdown;
#                       torchtests  the torch op's launcher and GPU tests;
#                       tune   the varlen workload over fa2 and fa3, warm-started from the shipped
#                              varlen results (bench/h200/varlen_campaign.sh);
#                       bench  bench/varlen_bench.py (fa2 and fa3 _vl candidates, SDPA padded,
#                              torch's FA2 varlen, the same tokens as one dense call).
# Logs and results under $OUT.
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
STAGES=${STAGES:-tests fa3 torch tune bench}
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/env.txt
has() { [[ " $STAGES " == *" $1 "* ]]; }
pt="python3 -m pytest -q -p no:cacheprovider -m gpu -W ignore::DeprecationWarning"
if has tests; then
  timeout ${TESTS_TIMEOUT:-420} $pt tests/measure/test_gpu_varlen.py tests/codegen/test_gpu_header_varlen.py > $OUT/gpu_varlen.log 2>&1
  tail -25 $OUT/gpu_varlen.log
fi
if has fa3; then
  timeout ${FA3_TIMEOUT:-300} $pt tests/families/fa3/test_gpu.py -k "not every_config" > $OUT/gpu_fa3.log 2>&1
  tail -5 $OUT/gpu_fa3.log
fi
if has torchtests; then
  timeout ${TORCH_TESTS_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning \
    tests/fa2tune/test_torch_launcher.py tests/fa2tune/test_gpu_torch_op.py > $OUT/gpu_torch_op.log 2>&1
  tail -5 $OUT/gpu_torch_op.log
fi
if has torch; then
  timeout ${TORCH_TIMEOUT:-150} python3 bench/torch_op_overhead.py --breakdown > $OUT/torch_op_overhead.log 2>&1
  tail -24 $OUT/torch_op_overhead.log
fi
if has tune; then
  VARLEN_FAMILY=fa2,fa3 VARLEN_WARM=db/data/h200_results_varlen.json DECODE=0 OUT=$OUT \
    VARLEN_TIMEOUT=${TUNE_TIMEOUT:-240} bash bench/h200/varlen_campaign.sh
fi
if has bench; then
  timeout ${BENCH_TIMEOUT:-240} python3 bench/varlen_bench.py --out $OUT/varlen_bench > $OUT/varlen_bench.log 2>&1
  tail -8 $OUT/varlen_bench.log
fi
