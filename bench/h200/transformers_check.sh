#!/usr/bin/env bash
# Device run for issue 26 item 1 (transformers backend): the GPU test of
# attn_implementation="fa2tune" and examples/transformers_generate.py, with nvcc hidden from
# PATH (a new user's machine: kernels built by NVRTC from the wheels). Logs under $OUT.
#
#   bash bench/h200/transformers_check.sh
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
hide=(env FA2TUNE_NVCC=/nonexistent/nvcc FA2TUNE_COMPILER=auto FA2TUNE_CACHE_DIR=/tmp/hf-cache)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; } \
  > "$OUT/transformers_env.log" 2>&1
"${hide[@]}" timeout "${GPU_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -W ignore -m gpu -rfEs -s \
  tests/fa2tune/test_gpu_transformers.py > "$OUT/transformers_gpu_test.log" 2>&1
"${hide[@]}" timeout "${EXAMPLE_TIMEOUT:-240}" python3 examples/transformers_generate.py \
  > "$OUT/transformers_generate.log" 2>&1
cat "$OUT/transformers_env.log"; tail -5 "$OUT/transformers_gpu_test.log"; grep -v "^INFO" "$OUT/transformers_generate.log" | tail -8
