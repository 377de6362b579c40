#!/usr/bin/env bash
# Device run for issue 25 (GPU targets): the limits the H200 reports against the targets'
# table, the compile tier of every target on the host's cores (bench/targets_compile.py), and
# the GPU tiers the change touches (split-KV defaults fitted to 99 KB GPUs, the torch op and
# the KV-cache op on this sm_90 GPU). Logs under $OUT.
#
#   bash bench/h200/targets_check.sh
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
  nvcc --version | tail -2
  python3 - <<'PY'
from codegen.targets import TARGETS
from measure.gpuinfo import arch_for, current_gpu_info, describe_limits

gpu = current_gpu_info(0)
target = arch_for(gpu)
print("GpuInfo:", gpu.to_dict())
print("target:", target)
print("campaign line:", describe_limits(gpu, target))
facts = TARGETS[target]
print("device smem/block", gpu.smem_optin_bytes, "table", facts.smem_per_block,
      "same" if gpu.smem_optin_bytes == facts.smem_per_block else "DIFFERENT")
import torch
p = torch.cuda.get_device_properties(0)
print("torch: smem/SM", p.shared_memory_per_multiprocessor, "table", facts.smem_per_sm,
      "threads/SM", p.max_threads_per_multi_processor, "table", facts.threads_per_sm,
      "regs/SM", p.regs_per_multiprocessor, "table", facts.registers_per_sm)
PY
} > "$OUT/device_limits.log" 2>&1
cat "$OUT/device_limits.log"
tier() { timeout "${GPU_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -W ignore -m gpu -rfEs "$@"; }
[ "${GPU:-1}" = 1 ] && {
  tier tests/families/splitkv/test_gpu.py -k fitted
  tier tests/fa2tune/test_gpu_torch_op.py tests/fa2tune/test_gpu_torch_kvcache.py
} > "$OUT/gpu_tiers.log" 2>&1 &
timeout "${COMPILE_TIMEOUT:-540}" python3 bench/targets_compile.py --out "$OUT/targets" -j 12 \
  > "$OUT/targets_compile.log" 2>&1
wait
grep -E "passed|failed|error" "$OUT/gpu_tiers.log" | tail -4
grep -v " INFO " "$OUT/targets_compile.log" | tail -30
