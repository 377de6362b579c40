#include <cuda_fp16.h>
extern "C" __global__ void simple_kernel(const float* a, float* b, int n) {
  __shared__ float buf[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  buf[threadIdx.x] = i < n ? a[i] : 0.f;
  __syncthreads();
  if (i < n) b[i] = buf[255 - threadIdx.x] * 2.f;
}
template <int N> __global__ void tmpl_kernel(float* out) {
  extern __shared__ float dyn[];
  dyn[threadIdx.x] = threadIdx.x * N;
  __syncthreads();
  out[threadIdx.x] = dyn[(threadIdx.x + 1) % blockDim.x];
}
template __global__ void tmpl_kernel<3>(float*);
