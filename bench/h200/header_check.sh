#!/usr/bin/env bash
# Device run: export the tuned header from the shipped H200 results (a fresh database), build the
# C++ example with plain nvcc and check it against its CPU reference, fp16 and bf16. D=96 has no
# tuned results, so it runs FlashAttention-2's default config (the header's fallback).
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD FA2TUNE_DATA_DIR=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/header_check.log
for dt in fp16 bf16; do
  ( set -x
    python3 -m fa2tune.cli export --gpu H200 --d 64,96,128 --dtype $dt -o /tmp/fa2_tuned_$dt.cuh &&
    time nvcc -std=c++17 -O2 -gencode=arch=compute_90,code=sm_90 -I/tmp -DFA2TUNE_HEADER="\"fa2_tuned_$dt.cuh\"" \
      examples/fa2_example.cu -o /tmp/fa2_example_$dt ) >> $OUT/header_check.log 2>&1 &
done
wait
for dt in fp16 bf16; do
  /tmp/fa2_example_$dt --d 64,96,128 --n 1,100,1000,3000 --causal 0,1 --dtype $dt >> $OUT/header_check.log 2>&1
  echo "$dt exit $?" | tee -a $OUT/header_check.log
done
tail -40 $OUT/header_check.log
