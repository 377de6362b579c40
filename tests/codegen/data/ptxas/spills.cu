extern "C" __global__ void __launch_bounds__(256, 8) heavy_kernel(const float* a, float* out, int n) {
  float acc[96];
  #pragma unroll
  for (int j = 0; j < 96; ++j) acc[j] = a[threadIdx.x + j * 37];
  for (int it = 0; it < n; ++it) {
    #pragma unroll
    for (int j = 0; j < 96; ++j) acc[j] = acc[j] * acc[(j * 7 + 3) % 96] + a[it * 96 + j];
  }
  float s = 0.f;
  #pragma unroll
  for (int j = 0; j < 96; ++j) s += acc[j] * (j + 1);
  out[threadIdx.x] = s;
}
extern "C" __global__ void stack_kernel(const float* a, float* out, int k) {
  float local[64];
  for (int j = 0; j < 64; ++j) local[j] = a[threadIdx.x * 64 + j];
  out[threadIdx.x] = local[k & 63];
}
