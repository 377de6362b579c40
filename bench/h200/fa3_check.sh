#!/usr/bin/env bash
# Device run for the fa3 (Hopper wgmma/TMA) family through the product: its compile and GPU
# test tiers (codegen.build -> measure.loader + measure.tma -> measure.verify, and the worker
# path BenchWorker/GpuJobHandler: build -> load -> verify -> time), then a short perf table
# against SDPA flash and cuDNN (bench/hopper/fa3_check.py perf --set short).
# Usage (repository root, 1x H200): bash bench/h200/fa3_check.sh          (~5-6 min)
#   FULL=1        also the whole-space test (tests/families/fa3/test_gpu.py::test_every_config, slow)
#   STAGES="..."  any of: env pytest perf micro main features sweep sass ncu
#                 (default "env pytest perf"; the others are the harness's stages of the
#                 2026-11-30 runs: correct --set main/features/sweep, SASS counts, ncu)
#   PERF_SET=short PERF_N=4096,8192   the perf stage's config set and sequence lengths
# Each stage is its own process with its own timeout, so a fault or a hang in one stage costs
# only that stage. Logs and JSON land under $OUT.
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=${FA2TUNE_CACHE_DIR:-/tmp/fa2cache}
STAGES=${STAGES:-"env pytest perf"}
PERF_SET=${PERF_SET:-short}
PERF_N=${PERF_N:-4096,8192}
CHECK="python3 bench/hopper/fa3_check.py"
W=/tmp/fa3build   # the harness's build cache (codegen.build layout: $W/sm_90a/<name>-<hash>/)
MARK="not slow"; [ "${FULL:-0}" = 1 ] && MARK="slow or not slow"
main_rc=0
for st in $STAGES; do
  case $st in
    env) {
           nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
           nvcc --version | tail -1
           python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
           python3 -c "import cuda.bindings, sqlalchemy; print('cuda-bindings', cuda.bindings.__version__, 'sqlalchemy', sqlalchemy.__version__)"
         } > "$OUT/env.txt" 2>&1; cat "$OUT/env.txt" ;;
    pytest) ( time timeout 420 python3 -m pytest -m "$MARK" -q -p no:cacheprovider --durations=15 \
                tests/families/fa3/test_host.py tests/families/fa3/test_compile.py tests/families/fa3/test_gpu.py ) > "$OUT/fa3_pytest.log" 2>&1
          echo "pytest rc=$?"; tail -40 "$OUT/fa3_pytest.log" ;;
    perf) [ "$main_rc" != 0 ] && { echo "skip perf: main failed ($main_rc)"; continue; }
          timeout 150 $CHECK perf --set "$PERF_SET" --n "$PERF_N" --jobs 16 --out "$OUT" --work $W > "$OUT/perf.log" 2>&1
          echo "perf rc=$?"; grep -A100 "^config" "$OUT/perf.log" || tail -30 "$OUT/perf.log" ;;
    micro) timeout 120 $CHECK micro --out "$OUT" --work $W 2>&1 | tee "$OUT/micro.log" ;;
    main) timeout 120 $CHECK correct --set main --out "$OUT" --work $W 2>&1 | tee "$OUT/main.log"
          main_rc=${PIPESTATUS[0]} ;;
    features|sweep) [ "$main_rc" = 124 ] && { echo "skip $st: main hung"; continue; }
          timeout 300 $CHECK correct --set "$st" --jobs 16 --out "$OUT" --work $W > "$OUT/$st.log" 2>&1
          echo "$st rc=$?"; grep -E "^(FAIL|BUILD)|correct:" "$OUT/$st.log" | head -40 ;;
    sass) for f in $W/sm_90a/fa3_d128_fp16_full_m128_n128_s2_rs_ov_pp_r240-*/*.cubin; do
            echo "$f HGMMA: $(cuobjdump --dump-sass "$f" | grep -c HGMMA)  HMMA: $(cuobjdump --dump-sass "$f" | grep -c ' HMMA')"
            cuobjdump --dump-sass "$f" | grep -E "HGMMA|WARPSYNC|BAR|SYNCS" | head -60 > "$OUT/sass_main.txt"
          done ;;
    ncu) [ "$main_rc" != 0 ] && { echo "skip ncu"; continue; }
         M=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum
         timeout 150 ncu --clock-control none --kernel-name regex:fa3_ --launch-count 2 --metrics $M \
           $CHECK perf --set main --n 8192 --out /tmp/ncu_out --work $W > "$OUT/ncu.log" 2>&1
         echo "ncu rc=$?"; grep -E "fa3_|pct|duration|ERR" "$OUT/ncu.log" | head -20 ;;
    *) echo "unknown stage $st" ;;
  esac
done
