extern "C" __global__ void big_smem_kernel(float* out) {
  __shared__ float buf[60000];
  buf[threadIdx.x] = threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = buf[(threadIdx.x * 13) % 60000];
}
