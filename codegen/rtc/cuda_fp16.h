// fa2tune NVRTC shim of <cuda_fp16.h> (see README.md).
#pragma once
struct __align__(2) __half {
  unsigned short __x;
};
struct __align__(4) __half2 {
  unsigned short __x, __y;
};
// Two floats rounded to nearest into one half2, lo in the low half (the toolkit's sm_80+ code).
__device__ __forceinline__ __half2 __floats2half2_rn(float lo, float hi) {
  __half2 r;
  asm("{ cvt.rn.f16x2.f32 %0, %2, %1;}\n"
      : "=r"(*reinterpret_cast<unsigned int*>(&r))
      : "f"(lo), "f"(hi));
  return r;
}
