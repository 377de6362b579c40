// fa2tune: the in-place append of a KV-cache call, one small kernel beside each cache kernel.
//
// A call that brings new keys and values writes them into the cache at each sequence's
// length before it attends (FlashAttention's flash_attn_with_kvcache semantics): new row r of
// sequence b goes to key position seqlens[b] + r of its cache row (a contiguous cache) or of
// its pages (a paged one), as the cache kernel then reads it (FaKvCache). One thread per
// 16-byte chunk of K or V, grid-stride; a bit-exact copy. A position at or past the cache's
// capacity (FaParams::nk) is dropped rather than written out of bounds, and the attention
// clamps that sequence's length to the capacity too.
//
// Kernel arguments: FaParams (the caches' pointers, strides, kv_heads, batch and capacity;
// q, o and lse unused), FaKvAppend (the new rows), FaKvCache.
#pragma once

#ifndef __CUDACC_RTC__  // NVRTC: the device built-ins need no header
#include <cuda_runtime.h>
#endif

#include <cstdint>

#include "fa_params.cuh"

// The new rows of one call: keys and values [batch, rows, kv_heads, D], strides in elements.
struct FaKvAppend {
  const void* k_new;
  const void* v_new;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int32_t rows;       // new rows per sequence (FaKvCache::added)
  int32_t page_size;  // keys per page of a paged cache; 0 for a contiguous one
  int32_t chunks;     // 16-byte chunks per row (head dim * element bytes / 16)
  int32_t reserved;   // 0
};
static_assert(sizeof(FaKvAppend) == 80 && alignof(FaKvAppend) == 8, "FaKvAppend is in the ABI");
#ifndef __CUDACC_RTC__  // no constant offsetof in NVRTC (nvcc builds check)
static_assert(offsetof(FaKvAppend, rows) == 64 && offsetof(FaKvAppend, chunks) == 72,
              "FaKvAppend offsets");
#endif

namespace kvcache {

__device__ __forceinline__ void append(const FaParams& p, const FaKvAppend& a,
                                       const FaKvCache& kc) {
  const int64_t per_tensor = static_cast<int64_t>(p.batch) * a.rows * p.kv_heads * a.chunks;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < 2 * per_tensor;
       i += step) {
    const bool is_v = i >= per_tensor;
    int64_t j = is_v ? i - per_tensor : i;
    const int c = static_cast<int>(j % a.chunks);
    j /= a.chunks;
    const int h = static_cast<int>(j % p.kv_heads);
    j /= p.kv_heads;
    const int r = static_cast<int>(j % a.rows);
    const int b = static_cast<int>(j / a.rows);
    const int pos = kc.seqlens[b] + r;
    if (pos < 0 || pos >= p.nk) continue;  // past the capacity: dropped, never out of bounds
    const int row = kc.batch_idx != nullptr ? kc.batch_idx[b] : b;
    const int64_t bs = is_v ? p.v_batch_stride : p.k_batch_stride;
    const int64_t rs = is_v ? p.v_row_stride : p.k_row_stride;
    const int64_t hs = is_v ? p.v_head_stride : p.k_head_stride;
    int64_t dst = h * hs;  // elements (two bytes each: the cache kernels take fp16 and bf16)
    if (a.page_size > 0) {
      const int64_t page = kc.block_table[static_cast<int64_t>(row) * kc.table_stride +
                                          pos / a.page_size];
      dst += page * bs + static_cast<int64_t>(pos % a.page_size) * rs;
    } else {
      dst += row * bs + static_cast<int64_t>(pos) * rs;
    }
    const int64_t src = is_v ? b * a.v_batch_stride + r * a.v_row_stride + h * a.v_head_stride
                             : b * a.k_batch_stride + r * a.k_row_stride + h * a.k_head_stride;
    const uint4* from = reinterpret_cast<const uint4*>(
        static_cast<const uint16_t*>(is_v ? a.v_new : a.k_new) + src) + c;
    uint4* to = reinterpret_cast<uint4*>(
        static_cast<uint16_t*>(const_cast<void*>(is_v ? p.v : p.k)) + dst) + c;
    *to = *from;
  }
}

}  // namespace kvcache

// The append kernel of cache config NAME (the cache macro defines it next to the attention).
#define KVCACHE_DEFINE_APPEND_KERNEL(NAME)                                                \
  extern "C" __global__ void __launch_bounds__(256)                                       \
      NAME##_append(const FaParams p, const FaKvAppend a, const FaKvCache kc) {            \
    kvcache::append(p, a, kc);                                                            \
  }
