// fa2tune: the kernel ABI shared by every kernel family (fa2 mma.sync, fa3 wgmma).
//
// FaParams is passed by value as the first kernel argument. Strides are in elements; the head
// dimension is contiguous. Layout and semantics: docs/architecture.md (fa2) and
// docs/fa3_kernel.md (fa3, which adds three CUtensorMap arguments after it). The
// static_asserts below pin the layout.
#pragma once

#include <cstddef>
#include <cstdint>

#ifndef FA2TUNE_FAPARAMS_DEFINED
#define FA2TUNE_FAPARAMS_DEFINED
struct FaParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // [batch, q_heads, nq], natural log; may be null
  int64_t q_batch_stride, q_head_stride, q_row_stride;
  int64_t k_batch_stride, k_head_stride, k_row_stride;
  int64_t v_batch_stride, v_head_stride, v_row_stride;
  int64_t o_batch_stride, o_head_stride, o_row_stride;
  int32_t batch, q_heads, kv_heads, nq, nk;
  float softmax_scale;
};
#endif

// The varlen kernels' second argument, passed by value after FaParams (fa3's kernels take the
// same bytes as fa3::VarlenArgs).
struct FaVarlen {
  const int32_t* cu_seqlens_q;  // [batch + 1]: sequence b's query rows are [cu[b], cu[b+1])
  const int32_t* cu_seqlens_k;  // [batch + 1]: ... and its key rows
  int32_t total_q;              // cu_seqlens_q[batch]: the row length of LSE [q_heads, total_q]
  int32_t reserved;             // 0
};
static_assert(sizeof(FaVarlen) == 24 && alignof(FaVarlen) == 8, "FaVarlen is part of the ABI");

// The run-time values of an attention variant, the last kernel argument of a config built
// with one (its local, softcap or sinks switch; plain kernels keep their arguments). The
// semantics are FlashAttention's (docs/variants.md); the compile-time switches say which
// fields a kernel reads.
struct FaVariant {
  int32_t window_left;   // query i (key position pos = i + nk - nq) sees keys >= pos - left; -1: all
  int32_t window_right;  // ... and keys <= pos + right; -1: all (a causal call passes 0)
  int32_t chunk;         // > 0: only keys in pos's chunk [pos - pos mod chunk, + chunk); 0: none
  float softcap;         // > 0: scores s (softmax-scaled) become softcap * tanh(s / softcap)
  const float* sinks;    // [q_heads] fp32 logits joining every row's softmax denominator; or null
};
static_assert(sizeof(FaVariant) == 24 && alignof(FaVariant) == 8, "FaVariant is part of the ABI");

// The KV-cache arguments of a cache kernel (splitkv's CacheTraits), passed by value after
// FaVariant. K and V are a cache: each sequence's valid length lives on the device
// (seqlens[b] keys before this call's `added` appended rows), so one launch, or one captured
// graph, serves every decode step. Contiguous caches hold [cache rows, capacity, kv_heads, D],
// batch row b reading cache row batch_idx[b] (or b). Paged ones hold
// [pages, page size, kv_heads, D], sequence b's key j in page
// block_table[row * table_stride + j / page size] with row = batch_idx[b] (or b); FaParams'
// k/v batch strides are then the page strides and nk the capacity (table_stride * page
// size). Lengths past nk are clamped to it. A left-padded contiguous cache (leftpad, as
// FlashAttention's cache_leftpad) starts sequence b at key leftpad[b]: it attends to keys
// [leftpad[b], length), counted from there (its masks align at length - leftpad[b]); paged
// caches take no leftpad (the host refuses it; their kernels ignore the field).
struct FaKvCache {
  const int32_t* seqlens;      // [batch] keys cached before this call's appended ones
  const int32_t* batch_idx;    // [batch] cache (or block-table) row of each batch row, or null
  const int32_t* block_table;  // [batch, table_stride] page of each page-sized key block
  int32_t table_stride;        // entries between two sequences' rows of block_table
  int32_t added;               // keys appended by this call, counted into every length
  const int32_t* leftpad;      // [batch] first key of each sequence (a contiguous cache), or null
};
static_assert(sizeof(FaKvCache) == 40 && alignof(FaKvCache) == 8, "FaKvCache is part of the ABI");

static_assert(sizeof(FaParams) == 160, "FaParams layout is part of the ABI");
static_assert(alignof(FaParams) == 8, "FaParams alignment is part of the ABI");
// Field offsets (NVRTC, which builds the kernels without a toolkit, has no constant offsetof;
// nvcc builds check them).
#ifndef __CUDACC_RTC__
static_assert(offsetof(FaParams, q) == 0 && offsetof(FaParams, k) == 8 &&
                  offsetof(FaParams, v) == 16 && offsetof(FaParams, o) == 24 &&
                  offsetof(FaParams, lse) == 32,
              "pointer offsets");
static_assert(offsetof(FaParams, q_batch_stride) == 40 &&
                  offsetof(FaParams, k_batch_stride) == 64 &&
                  offsetof(FaParams, v_batch_stride) == 88 &&
                  offsetof(FaParams, o_batch_stride) == 112 &&
                  offsetof(FaParams, o_row_stride) == 128,
              "stride offsets");
static_assert(offsetof(FaParams, batch) == 136 && offsetof(FaParams, q_heads) == 140 &&
                  offsetof(FaParams, kv_heads) == 144 && offsetof(FaParams, nq) == 148 &&
                  offsetof(FaParams, nk) == 152 && offsetof(FaParams, softmax_scale) == 156,
              "scalar offsets");
static_assert(offsetof(FaVariant, softcap) == 12 && offsetof(FaVariant, sinks) == 16,
              "FaVariant offsets");
static_assert(offsetof(FaKvCache, table_stride) == 24 && offsetof(FaKvCache, added) == 28 &&
                  offsetof(FaKvCache, leftpad) == 32,
              "FaKvCache offsets");
#endif  // __CUDACC_RTC__
