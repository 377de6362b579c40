#!/usr/bin/env bash
# Device run: build a few configs and dump their SASS with cuobjdump; instruction mix per kernel.
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD FA2TUNE_CACHE_DIR=/tmp/fa2cache
CONFIGS=${CONFIGS:-"fa2_d128_fp16_causal_br128_bc64_w4_s1_swz fa2_d128_fp16_full_br128_bc64_w4_s1_pad8 fa2_d128_fp16_causal_br128_bc64_w4_s1_pad8"}
for c in $CONFIGS; do
  cubin=$(python3 -m fa2tune.cli build --config $c --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print((d[0] if isinstance(d,list) else d)['cubin'])")
  cuobjdump -sass "$cubin" > $OUT/$c.sass
  python3 bench/h200/sass_stats.py $OUT/$c.sass
done | tee $OUT/sass_stats.txt
