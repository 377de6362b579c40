// Deliberately broken kernels with the fa2tune kernel ABI, for tests/test_gpu_faults.py.
// Each must be recorded with the right status and must not stop later jobs from measuring.
#include "fa2_params.cuh"

// Device-side trap: the launch fails (CUDA_ERROR_LAUNCH_FAILED), the context is lost.
extern "C" __global__ void fa2_test_trap(FaParams p) {
  if (blockIdx.x == 0 && threadIdx.x == 0 && p.nq > 0) __trap();
}

// Never returns. The volatile asm keeps the compiler from removing the side-effect-free loop.
extern "C" __global__ void fa2_test_hang(FaParams p) {
  for (;;) {
    asm volatile("nanosleep.u32 1000;");
  }
}

// Writes 1 TiB past the output: an illegal address (CUDA_ERROR_ILLEGAL_ADDRESS).
extern "C" __global__ void fa2_test_oob(FaParams p) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    volatile float* far = reinterpret_cast<volatile float*>(
        static_cast<char*>(p.o) + (1ull << 40));
    *far = 1.0f;
  }
}

// Runs cleanly but computes the wrong thing: O = Q (head dim 64) and LSE = 0.
// Same launch geometry as the naive kernel: one thread per query row.
extern "C" __global__ void fa2_test_wrong(FaParams p) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  if (row >= p.nq) return;
  const auto* q = static_cast<const unsigned short*>(p.q) + b * p.q_batch_stride +
                  h * p.q_head_stride + row * p.q_row_stride;
  auto* o = static_cast<unsigned short*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride +
            row * p.o_row_stride;
  for (int d = 0; d < 64; ++d) o[d] = q[d];
  if (p.lse != nullptr) p.lse[(static_cast<long long>(b) * p.q_heads + h) * p.nq + row] = 0.f;
}
