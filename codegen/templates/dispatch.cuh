// PUBLIC API (everything else is an implementation detail):
//
//   enum fa2tune_dtype { FA2TUNE_FP16, FA2TUNE_BF16 };
//
//   cudaError_t fa2tune_forward(const FaParams& p, int head_dim, fa2tune_dtype dtype,
//                               bool causal, cudaStream_t stream = 0);
//     Launches softmax(Q K^T * p.softmax_scale) V on `stream` (asynchronously). FaParams is
//     the kernel ABI struct defined below: Q, K, V, O pointers (16-byte aligned), element
//     strides (multiples of 8; the head dim is contiguous), batch, q_heads, kv_heads
//     (q_heads % kv_heads == 0), nq, nk, softmax_scale, and an optional float32 LSE output
//     [batch, q_heads, nq]. Causal is bottom-right aligned (query i sees key j iff
//     j <= i + nk - nq), so with nq == 1 it masks nothing and the call is served as
//     unmasked (the configs tuned for decode). Returns cudaErrorInvalidValue for a head dim or dtype this header
//     was not generated for or for misaligned/invalid parameters; otherwise the launch's
//     status.
//
//   size_t fa2tune_workspace_size(const FaParams& p, int head_dim, fa2tune_dtype dtype,
//                                 bool causal);
//   cudaError_t fa2tune_forward_with_workspace(const FaParams& p, int head_dim,
//                                              fa2tune_dtype dtype, bool causal,
//                                              void* workspace, size_t workspace_bytes,
//                                              cudaStream_t stream = 0);
//     For callers that manage device memory themselves. fa2tune_workspace_size is the bytes
//     of scratch the config fa2tune_forward would launch on the current device needs for p:
//     0 for every family but the split-KV one (splitkv, names "splitkv_..."), and 0 for
//     invalid parameters. fa2tune_forward_with_workspace launches like fa2tune_forward, but a
//     splitkv config uses the caller's buffer (at least fa2tune_workspace_size bytes, 16-byte
//     aligned; cudaErrorInvalidValue otherwise) instead of one the header allocates; other
//     families ignore it (it may be nullptr when the size is 0). The contract: zero-fill the
//     buffer (cudaMemset) once before its first use. A launch leaves it ready for any later
//     launch ordered after it (the same stream, or synchronised) whose nq, batch, q_heads and
//     kv_heads are the same (nk and the config may change); zero it again before a launch
//     with other values of those, or after a launch that failed. Two launches that may run
//     at the same time need two buffers.
//     Without a workspace (fa2tune_forward), a splitkv config allocates its own on the first
//     launch that needs one, one per (device, stream), grow-only and kept for the process:
//     launch every shape once before capturing a CUDA graph (cudaMalloc cannot be captured);
//     or use fa2tune_forward_with_workspace, which allocates nothing.
//
//   const char* fa2tune_config_name(const FaParams& p, int head_dim, fa2tune_dtype dtype,
//                                   bool causal);
//     The config fa2tune_forward would launch (nullptr when it would refuse).
//
//   struct fa2tune_tuned_choice { int index; const char* name; double distance;
//                                 int nq, nk, batch, q_heads, kv_heads; };
//   bool fa2tune_nearest_tuned(int head_dim, fa2tune_dtype dtype, bool causal, int nq,
//                              int nk, int batch, int q_heads, int kv_heads, int sm_count,
//                              fa2tune_tuned_choice* out);
//     Which tuned entry the dispatch takes for a call of this shape on the tuned GPU with
//     sm_count SMs, without launching or touching a device (so without the family guards
//     below, which need both): its index among the (D, dtype, causal)'s tuned entries (in
//     the order the comment above lists them), config name, distance and tuned shape. False
//     when the header has no tuned entry for (D, dtype, causal) or the shape is invalid.
//
//   cudaError_t fa2tune_forward_varlen(const FaParams& p, const FaVarlen& v, int num_seqs,
//                                      int max_seqlen_q, int max_seqlen_k, int head_dim,
//                                      fa2tune_dtype dtype, bool causal,
//                                      cudaStream_t stream = 0);
//     A packed variable-length batch (FlashAttention-2's varlen forward): the num_seqs
//     sequences' rows are packed one after another, Q and O [total_q, q_heads, D], K and V
//     [total_k, kv_heads, D] (p's row and head strides; its batch strides, batch, nq and nk
//     are ignored). FaVarlen (fa_params.cuh, inlined below) gives their int32 cumulative
//     offsets on the device, cu_seqlens_q and cu_seqlens_k ([num_seqs + 1] each, starting at
//     0), and two host values:
//       v.total_q  = cu_seqlens_q[num_seqs], the packed Q/O row count;
//       v.reserved = total_k = cu_seqlens_k[num_seqs], the packed K/V row count.
//     Set both. fa2 configs ignore v.reserved; the Hopper family's (fa3 "_vl" configs) bound
//     the TMA descriptors of K and V by it, so when the dispatch picks one (see "Varlen
//     dispatch") a total_k below max_seqlen_k, such as the 0 of a caller that leaves it unset,
//     is refused with cudaErrorInvalidValue. max_seqlen_q/k are the longest query/key
//     sequence (they size the grid). The optional LSE output is float32 [q_heads, total_q].
//     Causal is bottom-right aligned per sequence. More sequences than grid z's 65,535 are
//     launched in slices of the offsets, in order on `stream`.
//     Returns cudaErrorInvalidValue for num_seqs < 1, max_seqlen_q < 1, max_seqlen_k < 0,
//     total_q < max_seqlen_q, null or misaligned offsets, a head dim or dtype this header was
//     not generated for, parameters fa2tune_forward would refuse, or (fa3 pick) total_k <
//     max_seqlen_k; otherwise the launch's status. Only the host-side values are checked: the
//     offsets must describe the packed tensors, and total_k must be K's and V's row count.
//
//   const char* fa2tune_config_name_varlen(const FaParams& p, const FaVarlen& v,
//                                          int num_seqs, int max_seqlen_q, int max_seqlen_k,
//                                          int head_dim, fa2tune_dtype dtype, bool causal);
//     The config fa2tune_forward_varlen would launch (nullptr when it would refuse the call
//     before choosing; an fa3 pick's total_k is checked by its launch only).
//
//   bool fa2tune_nearest_tuned_varlen(int head_dim, fa2tune_dtype dtype, bool causal,
//                                     int num_seqs, int total_q, int q_heads, int kv_heads,
//                                     int sm_count, fa2tune_tuned_choice* out);
//     fa2tune_nearest_tuned for packed batches: the tuned varlen entry a batch of num_seqs
//     sequences and total_q query rows gets on the tuned GPU (its nq and nk are the tuned
//     batch's mean length, batch its count of sequences), without the family guards (as
//     fa2tune_nearest_tuned: an fa3 entry is named even where it cannot run). False when the
//     header has no tuned varlen entry for (D, dtype, causal) or the arguments are invalid.
//
// Dispatch: on a device whose name (cudaGetDeviceProperties, cached per device) matches the
// GPU this header was tuned for (named above; compared by fa2tune_detail::normalise_name,
// so "NVIDIA H200", "nvidia-h200" and "H200" are one GPU), the config tuned at the shape
// nearest to the call's (nq, nk, batch, q_heads, kv_heads) is used: the smallest sum of
// |ln ratio| of Nq, Nk, the grid fill (ceil(nq / 128) * q_heads * batch blocks over the
// device's SM count, clamped to [1/SMs, 8] waves) and the GQA group q_heads / kv_heads; ties
// go to the longer Nq, then Nk, then the larger batch * heads, then the fewer KV heads
// (fa_shape.cuh; the same rule as fa2tune's store and service, core/shape.py). On other
// GPUs, and for head dims, dtypes or masks without tuned results, FlashAttention-2's default
// config for the head dim is used. A tuned config of the Hopper family (fa3, names
// "fa3_...") is a candidate only where it can run: a GPU of compute capability 9.0, a
// program compiled for sm_90a and parameters TMA can address (fa3::can_launch); the nearest
// of the others is used instead, and the default config when none can run. Split-KV configs
// (splitkv, tuned on decode shapes: few query rows, long keys) run on every sm_80+ target,
// like FlashAttention-2's, and compete by the same shape distance.
//
// Varlen dispatch: packed batches run the varlen (_vl) configs of fa2 and of the Hopper
// family (fa3, names "fa3_..._vl"). On the tuned GPU, the config of the tuned varlen problem
// nearest to the call is used, each batch compared as its
// count of sequences at their mean length, {mean, mean, num_seqs, q_heads, kv_heads}
// (mean = total_q / num_seqs rounded to nearest, ties to even, at least 1:
// fa2tune_shape::varlen_shape, the store's core.shape.varlen_shape), by the distance above;
// key lengths do not enter (the tuned batches are self-attention). As for dense calls, an fa3
// varlen config is a candidate only where it can run (compute capability 9.0, a program
// compiled for sm_90a, strides TMA can address: fa3::can_launch_varlen); the nearest of the
// others is used instead, and the default's varlen twin when none can run. Elsewhere, and
// for head dims, dtypes or masks without tuned varlen results, the varlen twin of
// FlashAttention-2's default config (its tiles, _vl) runs: every (D, dtype, causal) the
// header serves densely it also serves packed.
//
// Compiling: C++17, any list of sm_80+ targets. The fa3 kernels (when the header has any)
// exist only in sm_90a code; for other targets they compile to stubs that are never launched:
//   -gencode=arch=compute_90a,code=sm_90a                H100/H200: fa3 and fa2 configs
//   -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=sm_80
//                                                        the same, plus fa2 on A100, L40, ...
//   -gencode=arch=compute_90,code=sm_90                  fa2 only (fa3 configs -> defaults;
//                                                        fa3 varlen ones -> fa2 varlen ones)
//
// ------------------------------------------------------------------------------------------
// codegen/templates/dispatch.cuh: the exported header's dispatch and launch code. Not a
// header to include on its own: codegen/export.py inlines it (and, in place of its
// #include lines, the kernel templates, the GPU-name rule and the rendered table) after the
// generated comment with the GPU name and the provenance of every tuned config. Each kernel
// family's part (its HeaderPart.template in codegen/families.py: fa2_fwd.cuh,
// fa3_launch.cuh, splitkv_launch.cuh, ...) is inlined only when the header holds a config of
// it, once, in the registry's order: the exporter renders "dispatch_families.inc" as
// their #include lines (a comment for each family left out), and inlines those in turn.
//
// The contract with the rendered table ("dispatch_table.inc", written by the exporter
// from the tuned results; the only generated C++ in the header; fa_shape.cuh, the shape
// distance, is inlined before it):
//   - namespace fa2tune_configs: one `using <config name> = <family>::Traits<...>;` per config
//     compiled into the header (tuned winners and defaults), followed by the explicit
//     instantiations of each config's kernel and launcher and its family's guard if any
//     (HeaderPart.instantiations: fa2::fwd_kernel, fa2::launch; fa3::fwd_kernel,
//     fa3::launch, fa3::can_launch; splitkv::fwd_kernel, splitkv::launch; for a varlen
//     config instead: fa2::fwd_varlen_kernel, fa2::launch_varlen; fa3::fwd_varlen_kernel,
//     fa3::launch_varlen, fa3::can_launch_varlen);
//   - in namespace fa2tune_detail:
//       kTunedGpu      the tuned GPU's name, already normalised (normalise_name);
//       kTuned         kTunedCount tables, one per tuned (D, dtype, causal), each with one
//                      choice per tuned problem, carrying the whole shape it was measured at
//                      (every field >= 1), sorted by (nq, nk, batch, heads, kv_heads) and
//                      distinct; a choice's `accepts` is its family's guard, or nullptr
//                      (fa2, splitkv: run wherever the header's code does), and its
//                      `workspace_size` / `launch_with_workspace` are
//                      Workspace<alias>::size / ::launch (nullptr for families that take no
//                      workspace);
//                      kTunedCount may be 0 (one sentinel entry then, never read);
//       kDefaults      kDefaultCount tables, one per supported (D, dtype, causal), each with
//                      exactly one choice (shape all 0): FlashAttention-2's default, whose
//                      `accepts` is nullptr.
//       kVarlenTuned   kVarlenTunedCount tables like kTuned's for packed batches, of
//                      VarlenChoice: one per tuned varlen problem, its shape the
//                      varlen_shape of its lengths (every field >= 1), sorted and distinct,
//                      its launcher its family's (fa2::launch_varlen<alias>,
//                      fa3::launch_varlen<alias>) and its `accepts` its family's varlen
//                      guard (fa3::can_launch_varlen<alias>) or nullptr (fa2); no
//                      workspace; kVarlenTunedCount may be 0 (one sentinel);
//       kVarlenDefaults kVarlenDefaultCount tables, one per kDefaults entry, each with one
//                      VarlenChoice (shape all 0): the default's varlen twin (fa2, `accepts`
//                      nullptr).
//   Every (D, dtype, causal) of kTuned also has a kDefaults entry, so a tuned shape on another
//   GPU still launches; likewise every kVarlenTuned key has a kVarlenDefaults entry.
#ifndef FA2TUNE_EXPORTED_HEADER_
#define FA2TUNE_EXPORTED_HEADER_

#include "fa2_fwd.cuh"
#include "fa_abi.cuh"
// Every family with a config in the header, in registry order (generated by the exporter).
#include "dispatch_families.inc"
#include "gpu_name.cuh"
#include "fa_shape.cuh"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

// The parameter struct's name in headers exported before 2026-12-01, kept so that programs
// written against them still compile.
using Fa2Params = FaParams;

// The values are part of the API (stable across exports): never renumber.
enum fa2tune_dtype : int { FA2TUNE_FP16 = 0, FA2TUNE_BF16 = 1 };

namespace fa2tune_detail {

using LaunchFn = cudaError_t (*)(const FaParams&, cudaStream_t);
using AcceptsFn = bool (*)(const FaParams&);
using WorkspaceSizeFn = size_t (*)(const FaParams&);
using LaunchWorkspaceFn = cudaError_t (*)(const FaParams&, void*, size_t, cudaStream_t);

// A config's caller-workspace entry points. A family whose launches can take a caller's
// workspace defines, in its namespace, workspace_hook_size(Traits*, const FaParams&) and
// workspace_hook_launch(Traits*, const FaParams&, void*, size_t, cudaStream_t)
// (splitkv_launch.cuh); argument-dependent lookup on the config's Traits finds them, so the
// table names Workspace<alias>::size / ::launch for every config, whatever its family, and
// they are nullptr where the family defines no hooks (it needs no workspace).
template <class T, class = void>
struct Workspace {
  static constexpr WorkspaceSizeFn size = nullptr;
  static constexpr LaunchWorkspaceFn launch = nullptr;
};

template <class T>
struct Workspace<T, std::void_t<decltype(workspace_hook_size(static_cast<T*>(nullptr),
                                                              std::declval<const FaParams&>()))>> {
  static size_t size_of(const FaParams& p) {
    return workspace_hook_size(static_cast<T*>(nullptr), p);
  }
  static cudaError_t launch_with(const FaParams& p, void* workspace, size_t bytes,
                                 cudaStream_t stream) {
    return workspace_hook_launch(static_cast<T*>(nullptr), p, workspace, bytes, stream);
  }
  static constexpr WorkspaceSizeFn size = &size_of;
  static constexpr LaunchWorkspaceFn launch = &launch_with;
};

struct Choice {
  fa2tune_shape::Shape shape;  // the shape this config was tuned at (all 0 for a default)
  LaunchFn launch;
  const char* name;
  AcceptsFn accepts;  // whether `launch` can run p on the current device; nullptr: always
  WorkspaceSizeFn workspace_size;           // nullptr: the family takes no workspace
  LaunchWorkspaceFn launch_with_workspace;  // nullptr: the family takes no workspace
};

struct Table {
  int d;
  int dtype;  // an fa2tune_dtype value
  bool causal;
  const Choice* choices;  // sorted by shape
  int count;
};

// A packed variable-length config (fa2 or fa3; no family's takes a workspace). The guard sees
// the call as the launcher will (varlen_params' FaParams, the caller's FaVarlen).
using VarlenLaunchFn = cudaError_t (*)(const FaParams&, const FaVarlen&, cudaStream_t);
using VarlenAcceptsFn = bool (*)(const FaParams&, const FaVarlen&);

struct VarlenChoice {
  fa2tune_shape::Shape shape;  // the tuned batch's varlen_shape (all 0 for a default)
  VarlenLaunchFn launch;
  const char* name;
  VarlenAcceptsFn accepts;  // whether `launch` can run here (fa3's guard); nullptr: always
};

struct VarlenTable {
  int d;
  int dtype;  // an fa2tune_dtype value
  bool causal;
  const VarlenChoice* choices;  // sorted by shape
  int count;
};

}  // namespace fa2tune_detail

#include "dispatch_table.inc"

namespace fa2tune_detail {

// Whether the current device is the tuned GPU. cudaGetDeviceProperties is slow, so each
// device's normalised name is cached per ordinal, and compared with this header's kTunedGpu
// on every call. The cache holds the name, not the answer, because g++ makes an inline
// function's statics one object per process (STB_GNU_UNIQUE), shared by every library built
// from a header like this one, and two such headers may be tuned for different GPUs.
inline bool on_tuned_gpu() {
  constexpr int kMaxDevices = 64;
  constexpr int kNameBytes = 257;  // cudaDeviceProp::name (256) and its terminator
  static char names[kMaxDevices][kNameBytes];
  static std::atomic<int> state[kMaxDevices];  // 0 = empty, 1 = being written, 2 = ready
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  const bool cacheable = dev >= 0 && dev < kMaxDevices;
  if (cacheable && state[dev].load(std::memory_order_acquire) == 2)
    return std::strcmp(names[dev], kTunedGpu) == 0;
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return false;
  char key[sizeof(prop.name) + 1];
  normalise_name(prop.name, key, sizeof(key));
  int empty = 0;
  if (cacheable && sizeof(key) <= static_cast<size_t>(kNameBytes) &&
      state[dev].compare_exchange_strong(empty, 1, std::memory_order_acq_rel)) {
    std::memcpy(names[dev], key, sizeof(key));  // only the claiming thread writes
    state[dev].store(2, std::memory_order_release);
  }
  return std::strcmp(key, kTunedGpu) == 0;
}

// The current device's SM count, for the shape distance's grid-fill term. The attribute is
// cached per device ordinal (0 = not looked up yet); racing threads store the same value.
// Should the query fail, an H100/H200's 132 stands in (the store's default too), uncached.
inline int sm_count() {
  constexpr int kMaxDevices = 64;
  constexpr int kFallback = 132;
  static std::atomic<int> cache[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return kFallback;
  const bool cacheable = dev >= 0 && dev < kMaxDevices;
  if (cacheable) {
    const int hit = cache[dev].load(std::memory_order_relaxed);
    if (hit > 0) return hit;
  }
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      sms < 1)
    return kFallback;
  if (cacheable) cache[dev].store(sms, std::memory_order_relaxed);
  return sms;
}

// A call's shape. The ABI allows nk == 0 (no keys: the output is zero), which has no log
// ratio; it counts as nk == 1, the shortest key length a tuned shape can have.
inline fa2tune_shape::Shape call_shape(long long nq, long long nk, long long batch,
                                       long long q_heads, long long kv_heads) {
  return {nq, nk > 1 ? nk : 1, batch, q_heads, kv_heads};
}

// Whether a choice can run p here: its family's guard (fa3::can_launch: compute capability
// 9.0 and an sm_90a image, cached per device; strides TMA can address), if it has one.
inline bool accepts(const Choice& c, const FaParams& p) {
  return c.accepts == nullptr || c.accepts(p);
}

// The index of t's choice nearest to `asked` (fa2tune_shape::nearest), among those that can
// run p when p is given; -1 when none can.
inline int nearest(const Table& t, const fa2tune_shape::Shape& asked, int sms,
                   const FaParams* p, double* distance = nullptr) {
  return fa2tune_shape::nearest(
      asked, t.count, sms,
      [&t, p](int i) -> const fa2tune_shape::Shape* {
        const Choice& c = t.choices[i];
        return p == nullptr || accepts(c, *p) ? &c.shape : nullptr;
      },
      distance);
}

// The tuned table of (D, dtype, causal), or nullptr.
inline const Table* tuned_table(int head_dim, int dtype, bool causal) {
  for (int i = 0; i < kTunedCount; ++i) {
    const Table& t = kTuned[i];
    if (t.d == head_dim && t.dtype == dtype && t.causal == causal) return &t;
  }
  return nullptr;
}

// Tuned tables first (on the tuned GPU only), then the defaults; nullptr for a head dim,
// dtype or mask this header has no config for. Tuned choices that cannot run here (an fa3
// config on a GPU that is not cc 9.0, or in a program built without sm_90a) are passed over
// for the nearest that can; when none can, the default runs. p is valid() here.
inline const Choice* select(const FaParams& p, int head_dim, int dtype, bool causal) {
  // One causal query row sees every key (bottom-right alignment): served as unmasked, where
  // decode is tuned; fa2tune's store, service and PyTorch op apply the same rule.
  if (p.nq == 1) causal = false;
  if (kTunedCount > 0 && on_tuned_gpu()) {
    const Table* t = tuned_table(head_dim, dtype, causal);
    if (t != nullptr) {
      const int i = nearest(*t, call_shape(p.nq, p.nk, p.batch, p.q_heads, p.kv_heads),
                            sm_count(), &p);
      if (i >= 0) return &t->choices[i];
    }
  }
  for (int i = 0; i < kDefaultCount; ++i) {
    const Table& t = kDefaults[i];
    if (t.d == head_dim && t.dtype == dtype && t.causal == causal)
      return accepts(t.choices[0], p) ? t.choices : nullptr;
  }
  return nullptr;
}

// The ABI's requirements: 16-byte aligned pointers, strides in multiples of 8 elements
// (the kernel moves 16-byte vectors), whole GQA groups, and grid dimensions CUDA allows.
inline bool valid(const FaParams& p) { return fa2tune_abi::valid(p); }

// The (D, dtype, causal) table among `count` varlen tables, or nullptr.
inline const VarlenTable* find_varlen(const VarlenTable* tables, int count, int head_dim,
                                      int dtype, bool causal) {
  for (int i = 0; i < count; ++i)
    if (tables[i].d == head_dim && tables[i].dtype == dtype && tables[i].causal == causal)
      return &tables[i];
  return nullptr;
}

// A varlen call's shape (fa2tune_shape::varlen_shape of its query rows); p is varlen_params'.
inline fa2tune_shape::Shape varlen_call_shape(const FaParams& p, const FaVarlen& v) {
  return fa2tune_shape::varlen_shape(v.total_q, p.batch, p.q_heads, p.kv_heads);
}

// Whether a varlen choice can run the call here: its family's guard, if it has one.
inline bool accepts_varlen(const VarlenChoice& c, const FaParams& p, const FaVarlen& v) {
  return c.accepts == nullptr || c.accepts(p, v);
}

// The index of t's entry nearest to `asked` (the dense rule), among those that can run the
// call when p and v are given (as nearest); -1 when none can.
inline int nearest_varlen(const VarlenTable& t, const fa2tune_shape::Shape& asked, int sms,
                          const FaParams* p, const FaVarlen* v, double* distance = nullptr) {
  return fa2tune_shape::nearest(
      asked, t.count, sms,
      [&t, p, v](int i) -> const fa2tune_shape::Shape* {
        const VarlenChoice& c = t.choices[i];
        return p == nullptr || v == nullptr || accepts_varlen(c, *p, *v) ? &c.shape : nullptr;
      },
      distance);
}

// The tuned varlen table's nearest entry that can run the call (on the tuned GPU only), else
// the default's varlen twin (fa2: it always can); nullptr for a head dim, dtype or mask this
// header has no config for. p is varlen_params'.
inline const VarlenChoice* select_varlen(const FaParams& p, const FaVarlen& v, int head_dim,
                                         int dtype, bool causal) {
  if (kVarlenTunedCount > 0 && on_tuned_gpu()) {
    const VarlenTable* t = find_varlen(kVarlenTuned, kVarlenTunedCount, head_dim, dtype, causal);
    if (t != nullptr) {
      const int i = nearest_varlen(*t, varlen_call_shape(p, v), sm_count(), &p, &v);
      if (i >= 0) return &t->choices[i];
    }
  }
  const VarlenTable* d = find_varlen(kVarlenDefaults, kVarlenDefaultCount, head_dim, dtype,
                                     causal);
  return d == nullptr || !accepts_varlen(d->choices[0], p, v) ? nullptr : d->choices;
}

// A varlen call's kernel arguments: p with the packed batch's count and longest lengths in
// place of batch, nq and nk, and zero batch strides (the offsets locate every sequence, as
// measure/varlen.py's varlen_params sets them); false when the ABI (valid) or the host-side
// varlen values refuse the call. The offsets are int32 arrays: 4-byte aligned.
inline bool varlen_params(const FaParams& p, const FaVarlen& v, int num_seqs,
                          int max_seqlen_q, int max_seqlen_k, FaParams* out) {
  if (num_seqs < 1 || max_seqlen_q < 1 || max_seqlen_k < 0) return false;
  if (v.cu_seqlens_q == nullptr || v.cu_seqlens_k == nullptr) return false;
  if ((reinterpret_cast<std::uintptr_t>(v.cu_seqlens_q) & 3u) != 0 ||
      (reinterpret_cast<std::uintptr_t>(v.cu_seqlens_k) & 3u) != 0)
    return false;
  if (v.total_q < max_seqlen_q) return false;  // the longest sequence is part of the total
  FaParams s = p;
  s.batch = num_seqs;
  s.nq = max_seqlen_q;
  s.nk = max_seqlen_k;
  s.q_batch_stride = s.k_batch_stride = s.v_batch_stride = s.o_batch_stride = 0;
  if (!valid(s)) return false;
  *out = s;
  return true;
}

// Launches c over p.batch sequences in slices of at most grid z's 65,535, each a later entry
// of the same offset arrays (they hold absolute row numbers, so O and LSE need no offset),
// in order on the stream, as measure/varlen.py's bind_varlen does.
inline cudaError_t launch_varlen_slices(const VarlenChoice& c, const FaParams& p,
                                        const FaVarlen& v, cudaStream_t stream) {
  constexpr int kMaxGridZ = 65535;
  for (int b0 = 0; b0 < p.batch; b0 += kMaxGridZ) {
    FaParams s = p;
    s.batch = p.batch - b0 < kMaxGridZ ? p.batch - b0 : kMaxGridZ;
    FaVarlen sv = v;
    sv.cu_seqlens_q = v.cu_seqlens_q + b0;
    sv.cu_seqlens_k = v.cu_seqlens_k + b0;
    const cudaError_t err = c.launch(s, sv, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace fa2tune_detail

// ------------------------------------------------------------------------------------------
// Public entry points (see the top of this part).

inline const char* fa2tune_config_name(const FaParams& p, int head_dim, fa2tune_dtype dtype,
                                       bool causal) {
  if (!fa2tune_detail::valid(p)) return nullptr;
  const fa2tune_detail::Choice* c =
      fa2tune_detail::select(p, head_dim, static_cast<int>(dtype), causal);
  return c == nullptr ? nullptr : c->name;
}

// The tuned entry the dispatch takes for a shape, found without a device (see the top).
struct fa2tune_tuned_choice {
  int index;         // among the (D, dtype, causal)'s tuned entries, sorted by shape
  const char* name;  // the entry's config
  double distance;   // from the asked shape to the entry's (0: the same shape)
  int nq, nk, batch, q_heads, kv_heads;  // the shape the entry was tuned at
};

namespace fa2tune_detail {

// The answer of fa2tune_nearest_tuned(_varlen): entry i, named `name`, tuned at `s`.
inline fa2tune_tuned_choice tuned_choice(int i, const char* name, double distance,
                                         const fa2tune_shape::Shape& s) {
  return {i,
          name,
          distance,
          static_cast<int>(s.nq),
          static_cast<int>(s.nk),
          static_cast<int>(s.batch),
          static_cast<int>(s.heads),
          static_cast<int>(s.kv_heads)};
}

}  // namespace fa2tune_detail

inline bool fa2tune_nearest_tuned(int head_dim, fa2tune_dtype dtype, bool causal, int nq,
                                  int nk, int batch, int q_heads, int kv_heads, int sm_count,
                                  fa2tune_tuned_choice* out) {
  if (nq < 1 || nk < 0 || batch < 1 || q_heads < 1 || kv_heads < 1 || q_heads % kv_heads != 0)
    return false;
  const fa2tune_detail::Table* t =
      fa2tune_detail::tuned_table(head_dim, static_cast<int>(dtype), causal && nq != 1);
  if (t == nullptr) return false;
  double distance = 0.0;
  const int i = fa2tune_detail::nearest(
      *t, fa2tune_detail::call_shape(nq, nk, batch, q_heads, kv_heads), sm_count, nullptr,
      &distance);
  if (i < 0) return false;
  if (out != nullptr)
    *out = fa2tune_detail::tuned_choice(i, t->choices[i].name, distance, t->choices[i].shape);
  return true;
}

namespace fa2tune_detail {
// The split-Q families (fa2, fa3) put the batch in grid z, which stops at 65,535 blocks: a
// larger batch is launched as slices of at most that many sequences, in order on the stream
// (the split-KV family puts batch x heads in grid x and launches whole). Every element type
// the table holds is 2 bytes wide.
inline cudaError_t launch_batch_slices(const Choice& c, const FaParams& p, cudaStream_t stream) {
  constexpr int kMaxGridZ = 65535;
  if (c.workspace_size != nullptr || p.batch <= kMaxGridZ) return c.launch(p, stream);
  for (int b0 = 0; b0 < p.batch; b0 += kMaxGridZ) {
    FaParams s = p;
    s.batch = p.batch - b0 < kMaxGridZ ? p.batch - b0 : kMaxGridZ;
    s.q = static_cast<const char*>(p.q) + 2 * b0 * p.q_batch_stride;
    s.k = static_cast<const char*>(p.k) + 2 * b0 * p.k_batch_stride;
    s.v = static_cast<const char*>(p.v) + 2 * b0 * p.v_batch_stride;
    s.o = static_cast<char*>(p.o) + 2 * b0 * p.o_batch_stride;
    if (p.lse != nullptr) s.lse = p.lse + static_cast<int64_t>(b0) * p.q_heads * p.nq;
    const cudaError_t err = c.launch(s, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}
}  // namespace fa2tune_detail

inline cudaError_t fa2tune_forward(const FaParams& p, int head_dim, fa2tune_dtype dtype,
                                   bool causal, cudaStream_t stream = 0) {
  if (!fa2tune_detail::valid(p)) return cudaErrorInvalidValue;
  const fa2tune_detail::Choice* c =
      fa2tune_detail::select(p, head_dim, static_cast<int>(dtype), causal);
  if (c == nullptr) return cudaErrorInvalidValue;
  return fa2tune_detail::launch_batch_slices(*c, p, stream);
}

// Scratch bytes the config fa2tune_forward would launch here needs (see the top).
inline size_t fa2tune_workspace_size(const FaParams& p, int head_dim, fa2tune_dtype dtype,
                                     bool causal) {
  if (!fa2tune_detail::valid(p)) return 0;
  const fa2tune_detail::Choice* c =
      fa2tune_detail::select(p, head_dim, static_cast<int>(dtype), causal);
  return c == nullptr || c->workspace_size == nullptr ? 0 : c->workspace_size(p);
}

// fa2tune_forward with the caller's workspace (contract: see the top).
inline cudaError_t fa2tune_forward_with_workspace(const FaParams& p, int head_dim,
                                                  fa2tune_dtype dtype, bool causal,
                                                  void* workspace, size_t workspace_bytes,
                                                  cudaStream_t stream = 0) {
  if (!fa2tune_detail::valid(p)) return cudaErrorInvalidValue;
  const fa2tune_detail::Choice* c =
      fa2tune_detail::select(p, head_dim, static_cast<int>(dtype), causal);
  if (c == nullptr) return cudaErrorInvalidValue;
  if (c->launch_with_workspace == nullptr) return fa2tune_detail::launch_batch_slices(*c, p, stream);
  return c->launch_with_workspace(p, workspace, workspace_bytes, stream);
}

// ------------------------------------------------------------------------------------------
// Packed variable-length entry points (see the top).

inline const char* fa2tune_config_name_varlen(const FaParams& p, const FaVarlen& v,
                                              int num_seqs, int max_seqlen_q, int max_seqlen_k,
                                              int head_dim, fa2tune_dtype dtype, bool causal) {
  FaParams s{};
  if (!fa2tune_detail::varlen_params(p, v, num_seqs, max_seqlen_q, max_seqlen_k, &s))
    return nullptr;
  const fa2tune_detail::VarlenChoice* c =
      fa2tune_detail::select_varlen(s, v, head_dim, static_cast<int>(dtype), causal);
  return c == nullptr ? nullptr : c->name;
}

inline cudaError_t fa2tune_forward_varlen(const FaParams& p, const FaVarlen& v, int num_seqs,
                                          int max_seqlen_q, int max_seqlen_k, int head_dim,
                                          fa2tune_dtype dtype, bool causal,
                                          cudaStream_t stream = 0) {
  FaParams s{};
  if (!fa2tune_detail::varlen_params(p, v, num_seqs, max_seqlen_q, max_seqlen_k, &s))
    return cudaErrorInvalidValue;
  const fa2tune_detail::VarlenChoice* c =
      fa2tune_detail::select_varlen(s, v, head_dim, static_cast<int>(dtype), causal);
  if (c == nullptr) return cudaErrorInvalidValue;
  return fa2tune_detail::launch_varlen_slices(*c, s, v, stream);
}

// The tuned varlen entry a packed batch gets, found without a device (see the top).
inline bool fa2tune_nearest_tuned_varlen(int head_dim, fa2tune_dtype dtype, bool causal,
                                         int num_seqs, int total_q, int q_heads, int kv_heads,
                                         int sm_count, fa2tune_tuned_choice* out) {
  if (num_seqs < 1 || total_q < 0 || q_heads < 1 || kv_heads < 1 || q_heads % kv_heads != 0)
    return false;
  const fa2tune_detail::VarlenTable* t =
      fa2tune_detail::find_varlen(fa2tune_detail::kVarlenTuned, fa2tune_detail::kVarlenTunedCount,
                                  head_dim, static_cast<int>(dtype), causal);
  if (t == nullptr) return false;
  double distance = 0.0;
  const int i = fa2tune_detail::nearest_varlen(
      *t, fa2tune_shape::varlen_shape(total_q, num_seqs, q_heads, kv_heads), sm_count, nullptr,
      nullptr, &distance);
  if (i < 0) return false;
  if (out != nullptr)
    *out = fa2tune_detail::tuned_choice(i, t->choices[i].name, distance, t->choices[i].shape);
  return true;
}

#endif  // FA2TUNE_EXPORTED_HEADER_
