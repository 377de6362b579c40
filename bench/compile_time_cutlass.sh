#!/usr/bin/env bash
# Issue 12: compile seconds per config, own PTX wrappers (fa3 template) vs CUTLASS/CuTe.
# Manual benchmark, not for CI: downloads the nvidia-cutlass wheel (PyPI) into $WORK.
# Runs one nvcc at a time (wall seconds of each compile are the figure reported).
#   bash bench/compile_time_cutlass.sh            # from the repo root
# Env: NVCC (default nvcc), PY (default python3), WORK (default /tmp/cutlass), REPS (default 2)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NVCC=${NVCC:-nvcc}; PY=${PY:-python3}; WORK=${WORK:-/tmp/cutlass}; REPS=${REPS:-2}
FLAGS=(-cubin -std=c++17 -O3 -Xptxas -v -gencode=arch=compute_90a,code=sm_90a)
mkdir -p "$WORK/a" "$WORK/b"

timed() {  # timed LABEL LOG cmd...: prints "LABEL seconds"
  local label=$1 log=$2; shift 2
  local t0 t1; t0=$(date +%s.%N)
  if "$@" >"$log" 2>&1; then t1=$(date +%s.%N); echo "$label $(echo "$t1 - $t0" | bc)"
  else echo "$label FAILED (see $log)"; fi
}

echo "# $($NVCC --version | tail -1); $(nproc) cores; $(date -u +%F)"

# --- Sample A: the project's fa3 template (own PTX wrappers) -------------------------------
PYTHONPATH=$ROOT "$PY" - "$WORK/a" <<'EOF'
import sys
from codegen import fa3_space
from codegen.families import FA3
s = {d: fa3_space.seed_configs(d, "fp16", False) for d in (64, 128, 256)}
picks = [s[64][0], s[128][0], [c for c in s[128] if c.block_m == 192][0], s[256][0]]
for c in picks:
    open(f"{sys.argv[1]}/{c.name}.cu", "w").write(FA3.render(c))
    print(c.name)
EOF
for r in $(seq "$REPS"); do
  for f in "$WORK"/a/*.cu; do
    timed "A rep$r $(basename "$f" .cu)" "${f%.cu}.log" \
      "$NVCC" "${FLAGS[@]}" -I "$ROOT/codegen/templates" "$f" -o "${f%.cu}.cubin"
  done
done

# --- Sample B: CUTLASS 88_hopper_fmha forward kernel, one instantiation ---------------------
WHL=$WORK/nvidia_cutlass-4.2.0.0-py3-none-any.whl
[ -f "$WHL" ] || "$PY" -m pip download -q --no-deps nvidia-cutlass==4.2.0.0 -d "$WORK"
[ -d "$WORK/w" ] || unzip -q -o "$WHL" -d "$WORK/w"
SRC=$WORK/w/cutlass_library/source
# The example's FwdRunner kernel for d=128 fp16 (run_fwd_128: "tma ws cooperative 128x128x128",
# DefaultFusion, i.e. no mask), kernel only: explicit instantiation of cutlass::device_kernel.
cat > "$WORK/b/fmha_fwd_d128.cu" <<'EOF'
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "collective/fmha_fusion.hpp"
#include "kernel/fmha_kernel_builder.hpp"
using namespace cute;
using StrideQKV = cute::tuple<int, _1, cute::tuple<int, int>>;  // Q/K/V: (seq, D, (B, H))
using FmhaKernel = cutlass::fmha::kernel::FmhaBuilder<
    cutlass::half_t, float, float, Shape<_128, _128, _128>, StrideQKV, StrideQKV, StrideQKV,
    cutlass::fmha::collective::DefaultFusion,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::Kernel;
template __global__ void cutlass::device_kernel<FmhaKernel>(CUTLASS_GRID_CONSTANT FmhaKernel::Params const);
EOF
BINC=(-I "$SRC/include" -I "$SRC/tools/util/include" -I "$SRC/examples/88_hopper_fmha"
      -I "$SRC/examples/common" -DNDEBUG --expt-relaxed-constexpr)
for r in $(seq "$REPS"); do
  f=$WORK/b/fmha_fwd_d128.cu
  timed "B rep$r cutlass_fmha_fwd_d128_128x128_coop" "${f%.cu}.log" \
    "$NVCC" "${FLAGS[@]}" "${BINC[@]}" "$f" -o "${f%.cu}.cubin"
done
