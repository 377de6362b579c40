// fa2tune: host launchers of the split-KV family for the exported header.
//
// A split launch needs a float32 workspace (partial O and LSE per row tile and split) and a
// zeroed counter per row tile; the kernel leaves the counters at zero when it finishes, so
// one workspace serves every later launch that is ordered after it on the same stream.
//
// launch() keeps one grow-only workspace per (device, stream), allocated and zeroed on the
// first launch that needs it (so run each shape once before capturing a CUDA graph: the
// allocation cannot happen during capture). launch_with_workspace() takes the caller's
// buffer instead: workspace_size() bytes, zero-filled once before its first use.
#pragma once

#include <map>
#include <mutex>
#include <utility>

#include "splitkv_fwd.cuh"

namespace splitkv {

struct WorkspaceCache {
  std::mutex mutex;
  std::map<std::pair<int, cudaStream_t>, std::pair<void*, size_t>> buffers;
};

inline WorkspaceCache& workspace_cache() {
  static WorkspaceCache cache;  // never destroyed before the last launch of the process
  return cache;
}

// A zero-filled buffer of at least `bytes` for launches on `stream` of the current device.
inline cudaError_t cached_workspace(cudaStream_t stream, size_t bytes, void** out) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  WorkspaceCache& cache = workspace_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  std::pair<void*, size_t>& slot = cache.buffers[{device, stream}];
  if (slot.second < bytes) {
    if (slot.first != nullptr) cudaFree(slot.first);  // waits for the launches using it
    slot = {nullptr, 0};
    if ((err = cudaMalloc(&slot.first, bytes)) != cudaSuccess) return err;
    if ((err = cudaMemsetAsync(slot.first, 0, bytes, stream)) != cudaSuccess) return err;
    slot.second = bytes;
  }
  *out = slot.first;
  return cudaSuccess;
}

template <class T>
inline size_t workspace_size(const Fa2Params& p) {
  return workspace_bytes<T>(p, splits_for<T>(p));
}

template <class T>
inline cudaError_t launch_with_workspace(const Fa2Params& p, void* workspace, size_t bytes,
                                         cudaStream_t stream) {
  const int splits = splits_for<T>(p);
  const size_t need = workspace_bytes<T>(p, splits);
  if (bytes < need || (need > 0 && workspace == nullptr)) return cudaErrorInvalidValue;
  const int64_t tiles = static_cast<int64_t>((p.q_heads / p.kv_heads) * p.nq + T::Rows - 1) /
                        T::Rows * p.kv_heads * p.batch;
  if (tiles > 0x7fffffff) return cudaErrorInvalidConfiguration;
  float* ws_o = static_cast<float*>(workspace);
  const int64_t partial = splits > 1 ? tiles * splits * T::Rows : 0;
  float* ws_lse = ws_o == nullptr ? nullptr : ws_o + partial * T::D;
  int* ws_count = ws_lse == nullptr ? nullptr : reinterpret_cast<int*>(ws_lse + partial);
  cudaError_t err = cudaFuncSetAttribute(fwd_kernel<T>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         T::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(splits));
  fwd_kernel<T><<<grid, T::kThreads, T::kSmemBytes, stream>>>(p, ws_o, ws_lse, ws_count);
  return cudaGetLastError();
}

template <class T>
inline cudaError_t launch(const Fa2Params& p, cudaStream_t stream) {
  const size_t bytes = workspace_size<T>(p);
  void* workspace = nullptr;
  if (bytes > 0) {
    cudaError_t err = cached_workspace(stream, bytes, &workspace);
    if (err != cudaSuccess) return err;
  }
  return launch_with_workspace<T>(p, workspace, bytes, stream);
}

}  // namespace splitkv
