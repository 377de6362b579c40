// fa2tune: host launchers of the split-KV family for the exported header.
//
// A split launch needs a float32 workspace (partial O and LSE per row tile and split) and a
// zeroed int counter per row tile; the kernel's last block of a tile resets that tile's
// counter, so counters that were zero before a launch are zero after it. The partials are
// scratch, but whatever lies where a later launch keeps its counters must be zero: so the
// counters never share memory with partials of another launch.
//
// launch() keeps, per (device, stream), one grow-only counter buffer (zeroed when allocated,
// only ever holding counters) and one grow-only buffer for the partials, allocated on the
// first launch that needs them (so run each shape once before capturing a CUDA graph: the
// allocation cannot happen during capture). Any shapes and configs may share them.
//
// launch_with_workspace() takes the caller's buffer instead: workspace_size() bytes,
// 16-byte aligned, zero-filled once before its first use. Its layout puts the counters first,
// in a region sized for the smallest row tile (16 rows), which depends only on the call's
// (nq, batch, q_heads, kv_heads): every config, any key length, keeps its counters there and
// its partials after it. So a launch leaves the buffer ready for any later launch ordered
// after it (same stream) with the same (nq, batch, q_heads, kv_heads); zero it again before
// using it for other values of those (or after a failed launch).
//
// Variant configs (VariantTraits) launch through launch_variant() and
// launch_variant_with_workspace(), which take FaVariant and are otherwise the same: the grid
// and the workspace are sized from nk as for plain configs (a window's row tiles divide only
// the keys it sees among the splits; splits past those write neutral partials).
//
// KV-cache configs (CacheTraits) launch through launch_cache() and
// launch_cache_with_workspace(), which take FaVariant and FaKvCache: FaParams' nk is the
// cache's capacity, which sizes the grid and the workspace as nk does for the others (so
// one geometry and one workspace serve every length a sequence grows to: a captured graph
// replays over a decode loop). launch_append() runs the config's append kernel, which writes
// a call's new K/V rows into the cache; the dispatch launches it first, on the same stream.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "splitkv_fwd.cuh"

namespace splitkv {

namespace launch_detail {

// Row tiles of T's launch: ceil(group * nq / Rows) per (KV head, batch).
template <class T>
inline int64_t row_tiles(const FaParams& p) {
  const int64_t rows = static_cast<int64_t>(p.q_heads / p.kv_heads) * p.nq;
  return (rows + T::Rows - 1) / T::Rows * p.kv_heads * p.batch;
}

// Bytes of the counter region of a caller's workspace: one int per row tile of the smallest
// tile any config has (16 rows), rounded up to 16 bytes so the float4 partials after it stay
// aligned. Independent of the config and of nk (see the top).
inline size_t counter_bytes(const FaParams& p) {
  const int64_t rows = static_cast<int64_t>(p.q_heads / p.kv_heads) * p.nq;
  const int64_t tiles = (rows + 15) / 16 * p.kv_heads * p.batch;
  return static_cast<size_t>((tiles * 4 + 15) / 16 * 16);
}

// Bytes of partial O (DHead floats a row: the head dim, not the tile's) and LSE of T's launch
// with `splits` splits (0 with one split: the blocks write O themselves).
template <class T>
inline size_t partial_bytes(const FaParams& p, int splits) {
  if (splits <= 1) return 0;
  return static_cast<size_t>(row_tiles<T>(p) * splits * T::Rows * (T::DHead + 1) * 4);
}

// `var`: the variant's values (a VariantTraits or CacheTraits T; null for a plain one);
// `kc`: the cache's (a CacheTraits T only).
template <class T>
inline cudaError_t run(const FaParams& p, int splits, float* ws_o, int* ws_count,
                       cudaStream_t stream, const FaVariant* var = nullptr,
                       const FaKvCache* kc = nullptr) {
  const int64_t tiles = row_tiles<T>(p);
  if (tiles > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const int64_t partial = splits > 1 ? tiles * splits * T::Rows : 0;
  float* ws_lse = ws_o == nullptr ? nullptr : ws_o + partial * T::DHead;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(splits));
  if constexpr (T::kCache) {  // before kVariant: a cache config may have variant switches
    cudaError_t err = cudaFuncSetAttribute(fwd_cache_kernel<T>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           T::kSmemBytes);
    if (err != cudaSuccess) return err;
    fwd_cache_kernel<T><<<grid, T::kThreads, T::kSmemBytes, stream>>>(p, ws_o, ws_lse,
                                                                     ws_count, *var, *kc);
  } else if constexpr (T::kVariant) {
    cudaError_t err = cudaFuncSetAttribute(fwd_variant_kernel<T>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           T::kSmemBytes);
    if (err != cudaSuccess) return err;
    fwd_variant_kernel<T><<<grid, T::kThreads, T::kSmemBytes, stream>>>(p, ws_o, ws_lse,
                                                                       ws_count, *var);
  } else {
    cudaError_t err = cudaFuncSetAttribute(fwd_kernel<T>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           T::kSmemBytes);
    if (err != cudaSuccess) return err;
    fwd_kernel<T><<<grid, T::kThreads, T::kSmemBytes, stream>>>(p, ws_o, ws_lse, ws_count);
  }
  return cudaGetLastError();
}

// One grow-only buffer; cudaFree of a smaller one waits for the launches using it.
struct Buffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  cudaError_t reserve(size_t need, bool zero, cudaStream_t stream) {
    if (bytes >= need) return cudaSuccess;
    if (ptr != nullptr) cudaFree(ptr);
    ptr = nullptr;
    bytes = 0;
    cudaError_t err = cudaMalloc(&ptr, need);
    if (err != cudaSuccess) return err;
    if (zero && (err = cudaMemsetAsync(ptr, 0, need, stream)) != cudaSuccess) return err;
    bytes = need;
    return cudaSuccess;
  }
};

struct WorkspaceCache {
  std::mutex mutex;
  std::map<std::pair<int, cudaStream_t>, std::pair<Buffer, Buffer>> slots;  // counters, partials
};

inline WorkspaceCache& workspace_cache() {
  static WorkspaceCache cache;  // never destroyed before the last launch of the process
  return cache;
}

}  // namespace launch_detail

// Bytes of caller workspace launch_with_workspace<T> needs for p (0: none, one split).
template <class T>
inline size_t workspace_size(const FaParams& p) {
  const size_t partial = launch_detail::partial_bytes<T>(p, splits_for<T>(p));
  return partial == 0 ? 0 : launch_detail::counter_bytes(p) + partial;
}

namespace launch_detail {

template <class T>
inline cudaError_t with_workspace(const FaParams& p, void* workspace, size_t bytes,
                                  cudaStream_t stream, const FaVariant* var,
                                  const FaKvCache* kc = nullptr) {
  const size_t need = workspace_size<T>(p);
  if (need == 0) return run<T>(p, 1, nullptr, nullptr, stream, var, kc);
  if (bytes < need || workspace == nullptr ||
      (reinterpret_cast<std::uintptr_t>(workspace) & 15u) != 0)
    return cudaErrorInvalidValue;
  char* base = static_cast<char*>(workspace);
  float* ws_o = reinterpret_cast<float*>(base + counter_bytes(p));
  return run<T>(p, splits_for<T>(p), ws_o, reinterpret_cast<int*>(base), stream, var, kc);
}

template <class T>
inline cudaError_t cached(const FaParams& p, cudaStream_t stream, const FaVariant* var,
                          const FaKvCache* kc = nullptr) {
  const int splits = splits_for<T>(p);
  const size_t partial = partial_bytes<T>(p, splits);
  if (partial == 0) return run<T>(p, 1, nullptr, nullptr, stream, var, kc);
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  WorkspaceCache& cache = workspace_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto& slot = cache.slots[{device, stream}];
  const size_t counters = static_cast<size_t>(row_tiles<T>(p)) * 4;
  if ((err = slot.first.reserve(counters, true, stream)) != cudaSuccess) return err;
  if ((err = slot.second.reserve(partial, false, stream)) != cudaSuccess) return err;
  return run<T>(p, splits, static_cast<float*>(slot.second.ptr),
                static_cast<int*>(slot.first.ptr), stream, var, kc);
}

}  // namespace launch_detail

template <class T>
inline cudaError_t launch_with_workspace(const FaParams& p, void* workspace, size_t bytes,
                                         cudaStream_t stream) {
  static_assert(!T::kVariant && !T::kCache,
                "variant configs launch with launch_variant_with_workspace");
  return launch_detail::with_workspace<T>(p, workspace, bytes, stream, nullptr);
}

template <class T>
inline cudaError_t launch(const FaParams& p, cudaStream_t stream) {
  static_assert(!T::kVariant && !T::kCache, "variant configs launch with launch_variant");
  return launch_detail::cached<T>(p, stream, nullptr);
}

// The variant kernels' launchers (a VariantTraits T): the plain ones' with FaVariant.
template <class T>
inline cudaError_t launch_variant_with_workspace(const FaParams& p, const FaVariant& var,
                                                 void* workspace, size_t bytes,
                                                 cudaStream_t stream) {
  static_assert(T::kVariant && !T::kCache, "plain configs launch with launch_with_workspace");
  return launch_detail::with_workspace<T>(p, workspace, bytes, stream, &var);
}

template <class T>
inline cudaError_t launch_variant(const FaParams& p, const FaVariant& var, cudaStream_t stream) {
  static_assert(T::kVariant && !T::kCache, "plain configs launch with launch");
  return launch_detail::cached<T>(p, stream, &var);
}

// The KV-cache kernels' launchers (a CacheTraits T): the variant ones' with FaKvCache, p.nk
// the capacity. A plain cache config reads no field of `var`.
template <class T>
inline cudaError_t launch_cache_with_workspace(const FaParams& p, const FaVariant& var,
                                               const FaKvCache& kc, void* workspace,
                                               size_t bytes, cudaStream_t stream) {
  static_assert(T::kCache, "launch_cache takes KV-cache configs");
  return launch_detail::with_workspace<T>(p, workspace, bytes, stream, &var, &kc);
}

template <class T>
inline cudaError_t launch_cache(const FaParams& p, const FaVariant& var, const FaKvCache& kc,
                                cudaStream_t stream) {
  static_assert(T::kCache, "launch_cache takes KV-cache configs");
  return launch_detail::cached<T>(p, stream, &var, &kc);
}

// Threads per block of the append kernel: kv_append.cuh's launch bound, which the Python
// side's launcher (fa2tune/ops/kvcache.py) uses too.
constexpr int kAppendThreads = 256;

// A cache config's append kernel (the header's twin of the cubin's <name>_append, the same
// device function): T names the config it belongs to, nothing in it depends on T.
template <class T>
__global__ void __launch_bounds__(kAppendThreads)
    append_kernel(const FaParams p, const FaKvAppend a, const FaKvCache kc) {
  kvcache::append(p, a, kc);
}

// Blocks of an append launch: one thread per 16-byte chunk of the new K and V rows,
// grid-stride past 65,535 blocks (the kernel loops), at least one block; the grid the Python
// side's CacheLauncher computes.
inline unsigned append_blocks(const FaParams& p, const FaKvAppend& a) {
  const int64_t chunks = static_cast<int64_t>(p.batch) * a.rows * p.kv_heads * a.chunks * 2;
  const int64_t blocks = (chunks + kAppendThreads - 1) / kAppendThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

// Writes a.rows new rows per sequence into the cache (p's k/v, strides and capacity nk) at
// kc.seqlens[b] + r, on `stream`; launch it before the attention that reads them.
template <class T>
inline cudaError_t launch_append(const FaParams& p, const FaKvAppend& a, const FaKvCache& kc,
                                 cudaStream_t stream) {
  static_assert(T::kCache, "only KV-cache configs have an append kernel");
  append_kernel<T><<<append_blocks(p, a), kAppendThreads, 0, stream>>>(p, a, kc);
  return cudaGetLastError();
}

// Hooks the exported header's dispatch finds by argument-dependent lookup on a config's
// Traits (dispatch.cuh, fa2tune_detail::Workspace): a family whose launches can take a
// caller's workspace defines both; the others define neither.
template <int D, class E, bool C, int R, int B, int W, int S, int P>
inline size_t workspace_hook_size(Traits<D, E, C, R, B, W, S, P>*, const FaParams& p) {
  return workspace_size<Traits<D, E, C, R, B, W, S, P>>(p);
}

template <int D, class E, bool C, int R, int B, int W, int S, int P>
inline cudaError_t workspace_hook_launch(Traits<D, E, C, R, B, W, S, P>*, const FaParams& p,
                                         void* workspace, size_t bytes, cudaStream_t stream) {
  return launch_with_workspace<Traits<D, E, C, R, B, W, S, P>>(p, workspace, bytes, stream);
}

// A VariantTraits pointer converts to its Traits base, which would find the plain hooks
// above and launch the plain kernel: these exact matches refuse that at compile time (a
// variant config's hooks are the variant ones below, which take FaVariant).
template <int D, class E, bool C, int R, int B, int W, int S, int P, bool L, bool SC, bool SN>
size_t workspace_hook_size(VariantTraits<D, E, C, R, B, W, S, P, L, SC, SN>*,
                           const FaParams& p) = delete;
template <int D, class E, bool C, int R, int B, int W, int S, int P, bool L, bool SC, bool SN>
cudaError_t workspace_hook_launch(VariantTraits<D, E, C, R, B, W, S, P, L, SC, SN>*,
                                  const FaParams& p, void* workspace, size_t bytes,
                                  cudaStream_t stream) = delete;
// ... and likewise for a CacheTraits (its launches take FaKvCache: launch_cache above).
template <int D, class E, bool C, int R, int B, int W, int S, int P, bool L, bool SC, bool SN,
          int PG, bool CS>
size_t workspace_hook_size(CacheTraits<D, E, C, R, B, W, S, P, L, SC, SN, PG, CS>*,
                           const FaParams& p) = delete;
template <int D, class E, bool C, int R, int B, int W, int S, int P, bool L, bool SC, bool SN,
          int PG, bool CS>
cudaError_t workspace_hook_launch(CacheTraits<D, E, C, R, B, W, S, P, L, SC, SN, PG, CS>*,
                                  const FaParams& p, void* workspace, size_t bytes,
                                  cudaStream_t stream) = delete;

// The variant dispatch's hooks (dispatch.cuh, fa2tune_detail::VariantWorkspace), found the
// same way on a VariantTraits: the workspace is sized as a plain config's (from nk), and the
// launch takes the variant's values.
template <int D, class E, bool C, int R, int B, int W, int S, int P, bool L, bool SC, bool SN>
inline size_t variant_workspace_hook_size(VariantTraits<D, E, C, R, B, W, S, P, L, SC, SN>*,
                                          const FaParams& p) {
  return workspace_size<VariantTraits<D, E, C, R, B, W, S, P, L, SC, SN>>(p);
}

template <int D, class E, bool C, int R, int B, int W, int S, int P, bool L, bool SC, bool SN>
inline cudaError_t variant_workspace_hook_launch(
    VariantTraits<D, E, C, R, B, W, S, P, L, SC, SN>*, const FaParams& p, const FaVariant& var,
    void* workspace, size_t bytes, cudaStream_t stream) {
  return launch_variant_with_workspace<VariantTraits<D, E, C, R, B, W, S, P, L, SC, SN>>(
      p, var, workspace, bytes, stream);
}

}  // namespace splitkv
