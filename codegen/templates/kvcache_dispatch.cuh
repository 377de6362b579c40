// fa2tune: the exported header's KV-cache entry points, fa2tune_forward_kvcache and its
// workspace and config-name twins (their contract is in dispatch.cuh's PUBLIC API comment).
// codegen/export.py inlines this file at the end of dispatch.cuh only for a header exported
// with page sizes (fa2tune export --kv-pages 0,16); a header without them has none of it, so
// a program can test FA2TUNE_HAS_KVCACHE. Header-side only: no kernel build reads it.
//
// Which kernel: the rule of fa2tune.torch.attention_with_kvcache (fa2tune/ops/cache_choice.py).
// A cache call is known on the host by its capacity (FaParams::nk), never by its lengths,
// which live on the device. A tuned KV-cache problem of the call's layout answers first (see
// kKvTuned below); otherwise its tile is the one the header's dense dispatch (select; with
// a variant, select_variant) gives the contiguous call of the same shape with nk the capacity,
// when that pick is a split-KV config, and otherwise the key's split-KV decode default (with
// the variant's switches), in both cases built as its cache twin for the call's page size
// (splitkv::CacheTraits, "_kvc" / "_kvc_pg<P>"). The variant is normalised as a packed batch's
// is (fa2tune_variant::normalize_packed with nq and the capacity), as the PyTorch op does.
//
// The contract with the rendered table ("kvcache_table.inc", written by the exporter from the
// configs the dispatch tables hold: codegen/dispatch_kvcache.py):
//   - namespace fa2tune_configs: one alias per cache config (splitkv::CacheTraits<...>) and
//     the explicit instantiations of its cache kernel, its two launchers, its workspace size
//     and its append kernel and launcher (HeaderPart.instantiations with cache);
//   - in namespace fa2tune_detail:
//       kKvPages   kKvPageCount page sizes, sorted and distinct (0: contiguous caches);
//       kKvCache   kKvCacheCount KvCacheChoice, one per (base, page size) of kKvPages: every
//                  split-KV config of the dense and variant tables (tuned entries and the
//                  decode defaults) and, for every variant key, the decode default of its
//                  (D, dtype, causal) with the key's switches; `base` is the name the
//                  dispatch's pick has, `fallback` marks each key's split-KV default (one per
//                  key and page size), and `name` is the cache config's. kKvCacheCount may be
//                  0 (one sentinel entry then, never read);
//       kKvTuned   kKvTunedCount KvTunedChoice, the tuned KV-cache problems' winners (fa2tune
//                  tune --kv-page) of plain attention for the page sizes of kKvPages: the
//                  shape each was measured at (nk its capacity) and its cache config as its
//                  own base, never a fallback; sorted by key, page size, then shape.
//                  kKvTunedCount may be 0 (one sentinel entry then, never read).
//
// Ahead of the rule above, as the op's rule 1: on the tuned GPU, a plain cache call runs the
// tuned entry of its key and page size nearest to its shape (fa2tune_shape::nearest, of the
// same phase: decode or prefill), when there is one.
#pragma once

#define FA2TUNE_HAS_KVCACHE 1

namespace fa2tune_detail {

using CacheLaunchFn = cudaError_t (*)(const FaParams&, const FaVariant&, const FaKvCache&,
                                      cudaStream_t);
using CacheLaunchWorkspaceFn = cudaError_t (*)(const FaParams&, const FaVariant&,
                                               const FaKvCache&, void*, size_t, cudaStream_t);
using AppendLaunchFn = cudaError_t (*)(const FaParams&, const FaKvAppend&, const FaKvCache&,
                                       cudaStream_t);

// One cache config: the key it serves (the base config's), its page size and what runs it.
struct KvCacheChoice {
  int d;
  int dtype;  // an fa2tune_dtype value
  bool causal;
  bool local;
  bool softcap;
  bool sinks;
  int page;            // 0: a contiguous cache
  bool fallback;       // the key's split-KV default: taken when the pick has no twin here
  const char* base;    // the config the dense or variant dispatch names
  const char* name;    // the cache config (base + "_kvc" or "_kvc_pg<page>")
  CacheLaunchFn launch;                          // the header's own workspace
  CacheLaunchWorkspaceFn launch_with_workspace;  // the caller's workspace
  WorkspaceSizeFn workspace_size;                // bytes of caller workspace
  AppendLaunchFn append;                         // writes a call's new rows first
};

// A tuned KV-cache problem's winner and the shape it was measured at.
struct KvTunedChoice {
  fa2tune_shape::Shape shape;
  KvCacheChoice choice;
};

}  // namespace fa2tune_detail

#include "kvcache_table.inc"

namespace fa2tune_detail {

// Whether the header has cache kernels of page size `page` (0: contiguous).
inline bool page_built(int page) {
  for (int i = 0; i < kKvPageCount; ++i)
    if (kKvPages[i] == page) return true;
  return false;
}

inline bool aligned4(const void* ptr) {
  return (reinterpret_cast<std::uintptr_t>(ptr) & 3u) == 0;
}

// What the host can check of a cache call (the ABI's rules for p, with nk the capacity; the
// page size built; the length and table pointers given and aligned for int32; room in each
// block-table row for every page of a capacity-long sequence; left padding in a contiguous
// cache only). The values behind the device pointers (lengths, batch indices, page numbers,
// left padding) cannot be checked here.
inline bool valid_cache(const FaParams& p, const FaKvCache& kc, int page) {
  if (!valid(p) || p.nk < 1 || !page_built(page)) return false;
  if (kc.seqlens == nullptr || !aligned4(kc.seqlens) || !aligned4(kc.batch_idx)) return false;
  if (kc.added < 0 || kc.added > p.nk || !aligned4(kc.leftpad)) return false;
  if (page == 0) return kc.block_table == nullptr;  // a table here means a paged cache
  if (kc.leftpad != nullptr) return false;          // the paged kernels take no left padding
  if (kc.block_table == nullptr || !aligned4(kc.block_table)) return false;
  return kc.table_stride >= (static_cast<int64_t>(p.nk) + page - 1) / page;
}

// The append kernel's argument: the caller's new rows (a.rows must be kc.added) with the page
// size and the chunks per row set from the call; false when the rows cannot be copied as
// 16-byte chunks. No rows (0) is no append, whatever the pointers.
inline bool append_args(const FaKvAppend& a, const FaKvCache& kc, int page, int head_dim,
                        FaKvAppend* out) {
  if (a.rows != kc.added) return false;
  if (a.rows > 0) {
    if (a.k_new == nullptr || a.v_new == nullptr) return false;
    if (!fa2tune_abi::aligned16(a.k_new) || !fa2tune_abi::aligned16(a.v_new)) return false;
    const int64_t strides[] = {a.k_batch_stride, a.k_row_stride, a.k_head_stride,
                               a.v_batch_stride, a.v_row_stride, a.v_head_stride};
    for (int64_t s : strides)
      if (s % 8 != 0) return false;
  }
  *out = a;
  out->page_size = page;
  out->chunks = head_dim * 2 / 16;  // every element type the header holds is 2 bytes wide
  out->reserved = 0;
  return true;
}

// The cache config of (D, dtype, mask, switches) and page size whose base is `base`, else the
// key's fallback; nullptr when the header has neither.
inline const KvCacheChoice* find_cache(int head_dim, int dtype, const fa2tune_variant::Normal& n,
                                       int page, const char* base) {
  const KvCacheChoice* fallback = nullptr;
  for (int i = 0; i < kKvCacheCount; ++i) {
    const KvCacheChoice& c = kKvCache[i];
    if (c.d != head_dim || c.dtype != dtype || c.causal != n.causal || c.local != n.local() ||
        c.softcap != n.softcap || c.sinks != n.sinks || c.page != page)
      continue;
    if (std::strcmp(c.base, base) == 0) return &c;
    if (c.fallback) fallback = &c;
  }
  return fallback;
}

// The tuned cache entry of (D, dtype, mask, page size) nearest to the call's shape (nk its
// capacity) on a device of `sms` SMs, or nullptr when none is of the call's phase. Plain
// attention only (the table holds no variant entry). Host-only: no CUDA call.
inline const KvCacheChoice* tuned_cache(const FaParams& p, int head_dim, int dtype, bool causal,
                                        int page, int sms) {
  const int i = fa2tune_shape::nearest(
      call_shape(p.nq, p.nk, p.batch, p.q_heads, p.kv_heads), kKvTunedCount, sms,
      [&](int j) -> const fa2tune_shape::Shape* {
        const KvCacheChoice& c = kKvTuned[j].choice;
        const bool mine = c.d == head_dim && c.dtype == dtype && c.causal == causal &&
                          c.page == page && c.launch != nullptr;
        return mine ? &kKvTuned[j].shape : nullptr;
      });
  return i >= 0 ? &kKvTuned[i].choice : nullptr;
}

// A cache call's kernel and the FaVariant it is given.
struct CachePick {
  cudaError_t status;  // cudaSuccess, else why the call is refused
  const KvCacheChoice* choice;
  FaVariant var;
};

// The pick for a cache call (see the top); `var` null is plain attention. Every refusal for
// invalid arguments comes before any CUDA call (the dispatch asks for the device's name and
// SM count only to pick).
inline CachePick pick_cache(const FaParams& p, const FaKvCache& kc, const FaKvAppend* append,
                            int page, const FaVariant* var, int head_dim, int dtype,
                            bool causal, FaKvAppend* append_out) {
  CachePick out{cudaErrorInvalidValue, nullptr, FaVariant{}};
  if (!valid_cache(p, kc, page)) return out;
  if (var != nullptr && !valid_variant(*var)) return out;
  if (append != nullptr && !append_args(*append, kc, page, head_dim, append_out)) return out;
  const FaVariant plain{-1, -1, 0, 0.f, nullptr};
  const FaVariant& v = var != nullptr ? *var : plain;
  const fa2tune_variant::Normal n = packed_variant(v, causal, p.nq, p.nk);
  const char* base = nullptr;
  if (n.plain()) {
    if (kKvTunedCount > 0 && on_tuned_gpu()) {
      out.choice = tuned_cache(p, head_dim, dtype, n.causal, page, sm_count());
      if (out.choice != nullptr) {
        out.status = cudaSuccess;
        out.var = kernel_variant(n, v);
        return out;
      }
    }
    const Choice* c = select(p, head_dim, dtype, n.causal);
    if (c == nullptr) return out;  // a head dim or dtype the header was not generated for
    base = c->name;
  } else {
    const VariantChoice* c = select_variant(p, n, head_dim, dtype);
    out.status = cudaErrorNotSupported;  // as fa2tune_forward_variant: switches not exported
    if (c == nullptr) return out;
    base = c->name;
  }
  out.choice = find_cache(head_dim, dtype, n, page, base);
  if (out.choice == nullptr) return out;  // no split-KV kernel of the key
  out.status = cudaSuccess;
  out.var = kernel_variant(n, v);
  return out;
}

// The append (when the call brings rows), then the attention: both on `stream`, in order. A
// caller's workspace is checked before the append, so a refused call leaves the cache alone.
inline cudaError_t run_cache(const CachePick& k, const FaParams& p, const FaKvCache& kc,
                             const FaKvAppend* append, bool caller_workspace, void* workspace,
                             size_t workspace_bytes, cudaStream_t stream) {
  if (caller_workspace) {
    const size_t need = k.choice->workspace_size(p);
    if (need > 0 && (workspace == nullptr || workspace_bytes < need ||
                     !fa2tune_abi::aligned16(workspace)))
      return cudaErrorInvalidValue;
  }
  if (append != nullptr && append->rows > 0) {
    const cudaError_t err = k.choice->append(p, *append, kc, stream);
    if (err != cudaSuccess) return err;
  }
  if (caller_workspace)
    return k.choice->launch_with_workspace(p, k.var, kc, workspace, workspace_bytes, stream);
  return k.choice->launch(p, k.var, kc, stream);
}

}  // namespace fa2tune_detail

// ------------------------------------------------------------------------------------------
// KV-cache entry points (see the top of dispatch.cuh).

inline bool fa2tune_kvcache_has_page_size(int page_size) {
  return fa2tune_detail::page_built(page_size);
}

inline const char* fa2tune_config_name_kvcache(const FaParams& p, const FaKvCache& kc,
                                               const FaKvAppend* append, int page_size,
                                               const FaVariant* var, int head_dim,
                                               fa2tune_dtype dtype, bool causal) {
  FaKvAppend a{};
  const fa2tune_detail::CachePick k = fa2tune_detail::pick_cache(
      p, kc, append, page_size, var, head_dim, static_cast<int>(dtype), causal, &a);
  return k.status == cudaSuccess ? k.choice->name : nullptr;
}

// Scratch bytes the config fa2tune_forward_kvcache would launch here needs (0 for one split
// or a refused call).
inline size_t fa2tune_workspace_size_kvcache(const FaParams& p, const FaKvCache& kc,
                                             const FaKvAppend* append, int page_size,
                                             const FaVariant* var, int head_dim,
                                             fa2tune_dtype dtype, bool causal) {
  FaKvAppend a{};
  const fa2tune_detail::CachePick k = fa2tune_detail::pick_cache(
      p, kc, append, page_size, var, head_dim, static_cast<int>(dtype), causal, &a);
  return k.status == cudaSuccess ? k.choice->workspace_size(p) : 0;
}

inline cudaError_t fa2tune_forward_kvcache(const FaParams& p, const FaKvCache& kc,
                                           const FaKvAppend* append, int page_size,
                                           const FaVariant* var, int head_dim,
                                           fa2tune_dtype dtype, bool causal,
                                           cudaStream_t stream = 0) {
  FaKvAppend a{};
  const fa2tune_detail::CachePick k = fa2tune_detail::pick_cache(
      p, kc, append, page_size, var, head_dim, static_cast<int>(dtype), causal, &a);
  if (k.status != cudaSuccess) return k.status;
  return fa2tune_detail::run_cache(k, p, kc, append != nullptr ? &a : nullptr, false, nullptr,
                                   0, stream);
}

// fa2tune_forward_kvcache with the caller's workspace (fa2tune_forward_with_workspace's
// contract; the counters' place depends on nq, batch, q_heads and kv_heads, never on the
// lengths, so one zeroed buffer serves a whole decode loop and its captured graph).
inline cudaError_t fa2tune_forward_kvcache_with_workspace(
    const FaParams& p, const FaKvCache& kc, const FaKvAppend* append, int page_size,
    const FaVariant* var, int head_dim, fa2tune_dtype dtype, bool causal, void* workspace,
    size_t workspace_bytes, cudaStream_t stream = 0) {
  FaKvAppend a{};
  const fa2tune_detail::CachePick k = fa2tune_detail::pick_cache(
      p, kc, append, page_size, var, head_dim, static_cast<int>(dtype), causal, &a);
  if (k.status != cudaSuccess) return k.status;
  return fa2tune_detail::run_cache(k, p, kc, append != nullptr ? &a : nullptr, true, workspace,
                                   workspace_bytes, stream);
}
