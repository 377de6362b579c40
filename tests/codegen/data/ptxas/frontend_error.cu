extern "C" __global__ void err_kernel(float* out) {
  out[threadIdx.x] = undefined_symbol + 1;
}
