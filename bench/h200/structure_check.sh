#!/usr/bin/env bash
# Device run for issue 22 (structure for variants): the GPU tiers of every path the
# restructuring touched on the host side (the kernels are cubin-identical, bench/ptx/), in two
# calls that each fit the device tool's 10 minutes: STAGE=1 the packed (varlen) launch path,
# the exported header's varlen entry, the torch op and the Hopper family (TMA host
# preparation moved into codegen/families/fa3/host.py); STAGE=2 split-KV (workspace host
# preparation), the fa2 kernels and the worker's fault isolation. Logs under $OUT.
set -u
case "${STAGE:-1}" in
  1) tiers="tests/measure/test_gpu_varlen.py tests/codegen/test_gpu_header_varlen.py
            tests/fa2tune/test_gpu_torch_op.py tests/fa2tune/test_gpu_torch_varlen.py
            tests/families/fa3/test_gpu.py" ;;
  2) tiers="tests/families/splitkv/test_gpu.py tests/families/fa2/test_gpu.py
            tests/measure/test_gpu_faults.py" ;;
  *) echo "STAGE must be 1 or 2" >&2; exit 2 ;;
esac
TIERS="$tiers" TIER_MARK="${TIER_MARK:-gpu and not slow}" TIER_TIMEOUT="${TIER_TIMEOUT:-280}" \
  OVERHEAD="${OVERHEAD:-0}" EXAMPLE="${EXAMPLE:-$([ "${STAGE:-1}" = 1 ] && echo 1 || echo 0)}" \
  bash "$(dirname "$0")/gpu_tiers.sh"
