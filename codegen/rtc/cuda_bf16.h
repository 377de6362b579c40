// fa2tune NVRTC shim of <cuda_bf16.h> (see README.md).
#pragma once
struct __align__(2) __nv_bfloat16 {
  unsigned short __x;
};
struct __align__(4) __nv_bfloat162 {
  unsigned short __x, __y;
};
// Two floats rounded to nearest into one bfloat162, lo in the low half (sm_80+).
__device__ __forceinline__ __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  __nv_bfloat162 r;
  asm("{ cvt.rn.bf16x2.f32 %0, %2, %1;}\n"
      : "=r"(*reinterpret_cast<unsigned int*>(&r))
      : "f"(lo), "f"(hi));
  return r;
}
