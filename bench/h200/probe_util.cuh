// fa2tune: what the header probes (splitkv_header_probe.cu, kvcache_header_probe.cu) share:
// a CUDA call outside a check that fails ends the probe with exit status 2, naming the call.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(expr)                                                                  \
  do {                                                                                    \
    const cudaError_t err_ = (expr);                                                      \
    if (err_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                  \
                   cudaGetErrorString(err_));                                             \
      std::exit(2);                                                                       \
    }                                                                                     \
  } while (0)
