__constant__ float coeffs[64];
extern "C" __global__ void stack_kernel(const float* a, float* out, int k) {
  float local[64];
  for (int j = 0; j < 64; ++j) local[j] = a[threadIdx.x * 64 + j] * coeffs[j];
  for (int j = 0; j < 64; ++j) local[(j * k) & 63] += local[j];
  out[threadIdx.x] = local[k & 63];
}
