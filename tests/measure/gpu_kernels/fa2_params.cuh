// The kernel argument of docs/architecture.md, for the GPU tests' stand-alone kernels.
// No includes at all, so the kernels compile with nvcc and with NVRTC alike.
#pragma once

struct FaParams {
  const void* q;  //   0
  const void* k;  //   8
  const void* v;  //  16
  void* o;        //  24
  float* lse;     //  32
  long long q_batch_stride, q_head_stride, q_row_stride;  // 40 (elements)
  long long k_batch_stride, k_head_stride, k_row_stride;
  long long v_batch_stride, v_head_stride, v_row_stride;
  long long o_batch_stride, o_head_stride, o_row_stride;
  int batch, q_heads, kv_heads, nq, nk;  // 136
  float softmax_scale;                   // 156
};
static_assert(sizeof(FaParams) == 160, "FaParams must be 160 bytes");

// fp16/bf16 <-> fp32 without cuda_fp16.h / cuda_bf16.h (not available to NVRTC by default).
__device__ __forceinline__ float fp16_to_f32(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ unsigned short f32_to_fp16(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float bf16_to_f32(unsigned short b) {
  return __uint_as_float(static_cast<unsigned int>(b) << 16);
}
__device__ __forceinline__ unsigned short f32_to_bf16(float f) {
  unsigned short b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
  return b;
}
