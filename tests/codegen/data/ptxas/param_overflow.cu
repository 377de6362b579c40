struct Big { float v[10000]; };
extern "C" __global__ void big_param_kernel(Big b, float* out) { out[threadIdx.x] = b.v[threadIdx.x]; }
