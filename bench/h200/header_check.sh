#!/usr/bin/env bash
# Device run: export the tuned header from the shipped H200 results (a fresh database), build the
# C++ example with plain nvcc and check it against its CPU reference, fp16 and bf16. D=96 has no
# tuned results, so it runs FlashAttention-2's default config (the header's fallback).
#
# Then the two-family header (issue 12 step 5): a store seeded with fa3 winners (the family's
# default configs at N=4096 for D=64/96/128, full and causal, fp16 and bf16) and one fa2 winner
# (D=128 fp16 full at N=256, so N <= 1000 picks fa2 there and N >= 1024 fa3). The example is
# built three ways and checked against the CPU reference on every shape:
#   sm_90a          fa3 configs must be picked (log: config=fa3_...) and correct;
#   sm_80+sm_90a    the fat binary: correct whichever cubin the runtime loads (log says which);
#   sm_90 (no "a")  the fa3 kernels are stubs: the dispatch must fall back to fa2 defaults, no
#                   config=fa3_ in the log, and still correct.
#
# Then the split-KV header (issue 13): a store seeded with a splitkv winner on the decode problem
# D=128 fp16 full, Nq=1 Nk=8192 B=8 H=32 KV=8 (splitkv_d128_fp16_full_r16_n32_w4_s2_k8) and an
# fa2 winner at N=1024, so decode calls dispatch to splitkv. bench/h200/splitkv_header_probe.cu
# is built for sm_90 and for sm_80+sm_90a (splitkv is portable: both must run it) and makes
# decode calls (nq 1 and 2, several nk) through fa2tune_forward (cached workspace),
# fa2tune_forward_with_workspace (the caller's buffer) and a captured CUDA graph, twice each,
# against a float32 CPU reference: one PASS/FAIL line per call.
# SPLITKV_WINNER=0 seeds the fa2 winner only: the decode calls then run the header's split-KV
# decode default (no tuned decode shape answers them).
#
# Then the KV-cache header (issue 24): tests/support/kvcache_header.py exports a header for the
# H200 with one tuned split-KV decode winner, one tuned sliding-window winner and an fa2 prefill
# winner, with KV-cache kernels of page sizes 0 and 16 (--kv-pages 0,16).
# bench/h200/kvcache_header_probe.cu is built for sm_90 and for sm_80+sm_90a and makes paged
# (P=16, shuffled block table) and contiguous cache calls through fa2tune_forward_kvcache, with
# and without appended rows, with the header's workspace and the caller's, and in a CUDA graph
# replayed over growing lengths, against a float32 CPU reference and the cache bit for bit:
# one PASS/FAIL line per call.
# STAGES="shipped fa3 splitkv kvcache" (default all four) picks the parts.
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
STAGES=${STAGES:-shipped fa3 splitkv kvcache}
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD FA2TUNE_DATA_DIR=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/header_check.log
status=0

# run_probe NAME HEADER SOURCE LOG: build SOURCE against /tmp/HEADER for sm_90 and for
# sm_80+sm_90a (in parallel), run each build, append its lines to LOG and count its PASS and
# FAIL lines; a failed build, a non-zero exit, a FAIL or no PASS at all sets status=1.
declare -A PROBE_GENS=(
  [sm90]="-gencode=arch=compute_90,code=sm_90"
  [fat]="-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a"
)
run_probe() {
  local name=$1 header=$2 source=$3 log=$4 v rc pass fail
  for v in sm90 fat; do
    # shellcheck disable=SC2086  # the gencode flags are a word list on purpose
    ( set -x; time nvcc -std=c++17 -O2 ${PROBE_GENS[$v]} -I/tmp -DFA2TUNE_HEADER="\"$header\"" \
        "$source" -o /tmp/${name}_probe_$v ) > $OUT/header_check_${name}_build_$v.log 2>&1 &
  done
  wait
  for v in sm90 fat; do
    cat $OUT/header_check_${name}_build_$v.log >> "$log"
    if [ ! -x /tmp/${name}_probe_$v ]; then echo "FAIL $name $v build" | tee -a "$log"; status=1; continue; fi
    /tmp/${name}_probe_$v > /tmp/${name}_run_$v.log 2>&1
    rc=$?; sed "s/^/[$v] /" /tmp/${name}_run_$v.log | tee -a "$log" | grep -E "^\[$v\] (PASS|FAIL|device|$name probe)"
    pass=$(grep -c "^PASS" /tmp/${name}_run_$v.log); fail=$(grep -c "^FAIL" /tmp/${name}_run_$v.log)
    echo "$name $v exit $rc, $pass PASS, $fail FAIL" | tee -a "$log"
    if [ $rc != 0 ] || [ "$fail" != 0 ] || [ "$pass" = 0 ]; then status=1; fi
  done
  grep -H "real" $OUT/header_check_${name}_build_*.log | sed 's/^/nvcc /'
}

if [[ " $STAGES " == *" shipped "* ]]; then
for dt in fp16 bf16; do
  ( set -x
    python3 -m fa2tune.cli export --gpu H200 --d 64,96,128 --dtype $dt -o /tmp/fa2_tuned_$dt.cuh &&
    time nvcc -std=c++17 -O2 -gencode=arch=compute_90,code=sm_90 -I/tmp -DFA2TUNE_HEADER="\"fa2_tuned_$dt.cuh\"" \
      examples/fa2_example.cu -o /tmp/fa2_example_$dt ) >> $OUT/header_check.log 2>&1 &
done
wait
for dt in fp16 bf16; do
  /tmp/fa2_example_$dt --d 64,96,128 --n 1,100,1000,3000 --causal 0,1 --dtype $dt >> $OUT/header_check.log 2>&1
  rc=$?; echo "$dt exit $rc" | tee -a $OUT/header_check.log; [ $rc = 0 ] || status=1
done
fi

if [[ " $STAGES " == *" fa3 "* ]]; then
LOG3=$OUT/header_check_fa3.log
PYTHONPATH=$PYTHONPATH:$PWD/tests python3 - /tmp/fa2_tuned_fa3.cuh > $LOG3 2>&1 <<'PY' || { echo "fa3 export failed"; status=1; }
import os, sys, tempfile
from pathlib import Path
from tests.support.factories import H200, make_config, make_report, ok_result
from codegen.fa3_space import default_config
from core.problem import Problem
from db.store import Store
from service.header import export_header
s = Store.from_url(f"sqlite:///{Path(tempfile.mkdtemp()) / 'fa3.db'}")
gpu_id = s.upsert_gpu(H200)
rows = [(d, t, c, 4096, default_config(d, t, c)) for d in (64, 96, 128) for t in ("fp16", "bf16") for c in (False, True)]
rows.append((128, "fp16", False, 256, make_config(128, "fp16", False, br=64, bc=64, stages=2, swizzle=True)))
for d, t, c, n, cfg in rows:
    problem = Problem(gpu=H200.name, d=d, n=n, dtype=t, causal=c)
    bid = s.record_build(make_report(cfg, arch="sm_90a" if cfg.family == "fa3" else "sm_90"))
    s.record_measurement(s.problem_id(problem, gpu_id), bid, ok_result(1.0, problem), H200, trial_number=0)
text = export_header(s, "H200", [64, 96, 128])
Path(sys.argv[1]).write_text(text)
print(f"exported {len(text)} bytes; fa3 configs: {text.count('template bool fa3::can_launch<')}")
PY
declare -A GEN=(
  [sm90a]="-gencode=arch=compute_90a,code=sm_90a"
  [fat]="-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a"
  [sm90]="-gencode=arch=compute_90,code=sm_90"
)
for v in sm90a fat sm90; do
  ( set -x; time nvcc -std=c++17 -O2 ${GEN[$v]} -I/tmp -DFA2TUNE_HEADER='"fa2_tuned_fa3.cuh"' \
      examples/fa2_example.cu -o /tmp/fa2_example_fa3_$v ) > $OUT/header_check_fa3_build_$v.log 2>&1 &
done
wait
for v in sm90a fat sm90; do
  cat $OUT/header_check_fa3_build_$v.log >> $LOG3
  for dt in fp16 bf16; do
    echo "== $v $dt" >> $LOG3
    /tmp/fa2_example_fa3_$v --d 64,96,128 --n 1,100,1000,3000,4096 --causal 0,1 --dtype $dt > /tmp/run_${v}_${dt}.log 2>&1
    rc=$?; cat /tmp/run_${v}_${dt}.log >> $LOG3
    fa3=$(grep -c "config=fa3_" /tmp/run_${v}_${dt}.log)
    echo "fa3 $v $dt exit $rc, $fa3 case(s) ran an fa3 config" | tee -a $LOG3
    [ $rc = 0 ] || status=1
    if [ $v = sm90a ] && [ "$fa3" = 0 ]; then echo "FAIL: sm_90a build ran no fa3 config" | tee -a $LOG3; status=1; fi
    if [ $v = sm90 ] && [ "$fa3" != 0 ]; then echo "FAIL: sm_90 build ran an fa3 stub" | tee -a $LOG3; status=1; fi
  done
done
grep -H "real" $OUT/header_check_fa3_build_*.log | sed 's/^/nvcc /'
fi

if [[ " $STAGES " == *" splitkv "* ]]; then
LOGS=$OUT/header_check_splitkv.log
PYTHONPATH=$PYTHONPATH:$PWD/tests python3 - /tmp/fa2_tuned_splitkv.cuh > $LOGS 2>&1 <<'PY' || { echo "FAIL splitkv export" | tee -a $LOGS; status=1; }
import os, sys, tempfile
from pathlib import Path
from tests.support.factories import H200, make_config, make_report, ok_result
from core.problem import Problem
from core.splitkv_config import SplitKvConfig
from db.store import Store
from service.header import export_header
s = Store.from_url(f"sqlite:///{Path(tempfile.mkdtemp()) / 'splitkv.db'}")
gpu_id = s.upsert_gpu(H200)
rows = [
    (Problem(gpu=H200.name, d=128, n=1, nk=8192, batch=8, heads=32, kv_heads=8),
     SplitKvConfig.from_name("splitkv_d128_fp16_full_r16_n32_w4_s2_k8")),
    (Problem(gpu=H200.name, d=128, n=1024), make_config(128, "fp16", False, br=64, bc=64, stages=2, swizzle=True)),
]
if os.environ.get("SPLITKV_WINNER", "1") == "0":  # no decode shape tuned: the split-KV default
    rows = rows[1:]
for problem, cfg in rows:
    bid = s.record_build(make_report(cfg, arch="sm_90"))
    s.record_measurement(s.problem_id(problem, gpu_id), bid, ok_result(0.05, problem), H200, trial_number=0)
text = export_header(s, "H200", [128], dtypes=["fp16"])
Path(sys.argv[1]).write_text(text)
print(f"exported {len(text)} bytes; splitkv configs: {text.count('template cudaError_t splitkv::launch<')}")
PY
run_probe splitkv fa2_tuned_splitkv.cuh bench/h200/splitkv_header_probe.cu "$LOGS"
fi

if [[ " $STAGES " == *" kvcache "* ]]; then
LOGK=$OUT/header_check_kvcache.log
( set -x; python3 -m tests.support.kvcache_header /tmp/fa2_tuned_kvcache.cuh 'NVIDIA H200' 0,16 ) > $LOGK 2>&1 \
  || { echo "FAIL kvcache export" | tee -a $LOGK; status=1; }
run_probe kvcache fa2_tuned_kvcache.cuh bench/h200/kvcache_header_probe.cu "$LOGK"
fi

tail -40 $OUT/header_check.log
echo "header_check status $status"
exit $status
