#!/usr/bin/env bash
# Device run (issue 13, items 4 and 5): the varlen and head-dim GPU tests, the varlen benchmark
# (bench/varlen_bench.py) and the whole fa2 GPU tier after the template change. Logs under $OUT.
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/varlen_run.log"
status=0
STAGES=${STAGES:-tests bench tier}
if [[ " $STAGES " == *" tests "* ]]; then
  python3 -m pytest -q -p no:cacheprovider -W ignore -m gpu tests/measure/test_gpu_varlen.py > "$OUT/gpu_varlen.log" 2>&1 || status=1
  tail -5 "$OUT/gpu_varlen.log" | tee -a "$OUT/varlen_run.log"
fi
if [[ " $STAGES " == *" bench "* ]]; then
  python3 bench/varlen_bench.py --out "$OUT/varlen" > "$OUT/varlen_bench.log" 2>&1 || status=1
  tail -12 "$OUT/varlen_bench.log" | tee -a "$OUT/varlen_run.log"
fi
if [[ " $STAGES " == *" tier "* ]]; then
  python3 -m pytest -q -p no:cacheprovider -W ignore -m gpu tests/families/fa2/test_gpu.py > "$OUT/gpu_kernels.log" 2>&1 || status=1
  tail -5 "$OUT/gpu_kernels.log" | tee -a "$OUT/varlen_run.log"
fi
exit $status
