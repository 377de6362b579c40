#!/usr/bin/env bash
# Device run for the fa3 (Hopper wgmma/TMA) family: micro-tests, correctness, timing, SASS, ncu.
# Usage (repository root, GPU host): STAGES="micro main features perf sass ncu" bash bench/h200/fa3_check.sh
# Second run (2026-11-30): STAGES="main features perf pytest" FEATURES_SET=sweep PERF_SET=sweep bash bench/h200/fa3_check.sh
# Each stage is its own process with its own timeout, so a fault or a hang in one stage costs
# only that stage. Logs and JSON land under $OUT.
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
STAGES=${STAGES:-"micro main features perf sass ncu"}
FEATURES_SET=${FEATURES_SET:-features}   # the config set the "features" stage verifies
PERF_SET=${PERF_SET:-perf}
PERF_N=${PERF_N:-4096,8192}
CHECK="python3 bench/hopper/fa3_check.py"
W=/tmp/fa3build
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  nvcc --version | tail -1
  python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
main_rc=0
for st in $STAGES; do
  case $st in
    micro) timeout 120 $CHECK micro --out "$OUT" --work $W 2>&1 | tee "$OUT/micro.log" ;;
    main) timeout 120 $CHECK correct --set main --out "$OUT" --work $W 2>&1 | tee "$OUT/main.log"
          main_rc=${PIPESTATUS[0]} ;;
    features) [ "$main_rc" = 124 ] && { echo "skip features: main hung"; continue; }
          timeout 300 $CHECK correct --set "$FEATURES_SET" --jobs 16 --out "$OUT" --work $W > "$OUT/features.log" 2>&1
          echo "features rc=$?"; grep -E "^(FAIL|BUILD)|correct:" "$OUT/features.log" | head -40 ;;
    perf) [ "$main_rc" != 0 ] && { echo "skip perf: main failed ($main_rc)"; continue; }
          timeout 300 $CHECK perf --set "$PERF_SET" --n "$PERF_N" --jobs 16 --out "$OUT" --work $W > "$OUT/perf.log" 2>&1
          echo "perf rc=$?"; grep -A100 "^config" "$OUT/perf.log" ;;
    pytest) timeout 300 python3 -m pytest -q --noconftest -p no:cacheprovider tests/test_fa3_gpu.py tests/test_fa3_compile.py > "$OUT/pytest.log" 2>&1
          echo "pytest rc=$?"; tail -5 "$OUT/pytest.log" ;;
    sass) for f in $W/fa3_d128_fp16_full_m128_n128_s2_rs_ov_pp_r240.cubin; do
            echo "$f HGMMA: $(cuobjdump --dump-sass "$f" | grep -c HGMMA)  HMMA: $(cuobjdump --dump-sass "$f" | grep -c ' HMMA')"
            cuobjdump --dump-sass "$f" | grep -E "HGMMA|WARPSYNC|BAR|SYNCS" | head -60 > "$OUT/sass_main.txt"
          done ;;
    ncu) [ "$main_rc" != 0 ] && { echo "skip ncu"; continue; }
         ncu --query-metrics 2>/dev/null | grep -E "^sm__pipe_tensor_op_(h|g)mma_cycles_active |^sm__throughput" > "$OUT/ncu_metrics.txt"
         cat "$OUT/ncu_metrics.txt"
         M=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum
         timeout 150 ncu --clock-control none --kernel-name regex:fa3_ --launch-count 2 --metrics $M \
           $CHECK perf --set main --n 8192 --out /tmp/ncu_out --work $W > "$OUT/ncu.log" 2>&1
         echo "ncu rc=$?"; grep -E "fa3_|pct|duration|ERR" "$OUT/ncu.log" | head -20 ;;
  esac
done
