// PUBLIC API (everything else is an implementation detail):
//
//   enum fa2tune_dtype { FA2TUNE_FP16, FA2TUNE_BF16 };
//
//   cudaError_t fa2tune_forward(const Fa2Params& p, int head_dim, fa2tune_dtype dtype,
//                               bool causal, cudaStream_t stream = 0);
//     Launches softmax(Q K^T * p.softmax_scale) V on `stream` (asynchronously). Fa2Params is
//     the kernel ABI struct defined below: Q, K, V, O pointers (16-byte aligned), element
//     strides (multiples of 8; the head dim is contiguous), batch, q_heads, kv_heads
//     (q_heads % kv_heads == 0), nq, nk, softmax_scale, and an optional float32 LSE output
//     [batch, q_heads, nq]. Causal is bottom-right aligned (query i sees key j iff
//     j <= i + nk - nq). Returns cudaErrorInvalidValue for a head dim or dtype this header
//     was not generated for or for misaligned/invalid parameters; otherwise the launch's
//     status.
//
//   const char* fa2tune_config_name(const Fa2Params& p, int head_dim, fa2tune_dtype dtype,
//                                   bool causal);
//     The config fa2tune_forward would launch (nullptr when it would refuse).
//
// Dispatch: on a device whose name (cudaGetDeviceProperties, cached per device) matches the
// GPU this header was tuned for (named above; compared by fa2tune_detail::normalise_name,
// so "NVIDIA H200", "nvidia-h200" and "H200" are one GPU), the config tuned at the N nearest
// to sqrt(nq * nk) on a log scale is used (bucket boundaries at the geometric midpoints of
// the tuned Ns). On other GPUs, and for head dims, dtypes or masks without tuned results,
// FlashAttention-2's default config for the head dim is used. A tuned config of the Hopper
// family (fa3, names "fa3_...") is used only where it can run: a GPU of compute capability
// 9.0, a program compiled for sm_90a and parameters TMA can address (fa3::can_launch);
// otherwise the default config is used instead.
//
// Compiling: C++17, any list of sm_80+ targets. The fa3 kernels (when the header has any)
// exist only in sm_90a code; for other targets they compile to stubs that are never launched:
//   -gencode=arch=compute_90a,code=sm_90a                H100/H200: fa3 and fa2 configs
//   -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=sm_80
//                                                        the same, plus fa2 on A100, L40, ...
//   -gencode=arch=compute_90,code=sm_90                  fa2 only (fa3 configs -> defaults)
//
// ------------------------------------------------------------------------------------------
// codegen/templates/fa2_dispatch.cuh: the exported header's dispatch and launch code. Not a
// header to include on its own: codegen/export.py inlines it (and, in place of its
// #include lines, the kernel templates, the GPU-name rule and the rendered table) after the
// generated comment with the GPU name and the provenance of every tuned config. A family's
// part (fa3_launch.cuh) is inlined only when the header holds a config of it; otherwise the
// exporter puts a comment in place of its #include.
//
// The contract with the rendered table ("fa2_dispatch_table.inc", written by the exporter
// from the tuned results; the only generated C++ in the header):
//   - namespace fa2tune_configs: one `using <config name> = <family>::Traits<...>;` per config
//     compiled into the header (tuned winners and defaults), followed by the explicit
//     instantiations of each config's kernel and launcher (fa2::fwd_kernel, fa2::launch;
//     fa3::fwd_kernel, fa3::launch and its guard fa3::can_launch);
//   - in namespace fa2tune_detail:
//       kTunedGpu      the tuned GPU's name, already normalised (normalise_name);
//       kTuned         kTunedCount tables, one per tuned (D, dtype, causal), each with its
//                      choices sorted by the N they were tuned at, ascending, N > 0; a
//                      choice's `accepts` is its family's guard, or nullptr (fa2: runs
//                      wherever the header's code does);
//                      kTunedCount may be 0 (one sentinel entry then, never read);
//       kDefaults      kDefaultCount tables, one per supported (D, dtype, causal), each with
//                      exactly one choice (n = 0): FlashAttention-2's default config, whose
//                      `accepts` is nullptr.
//   Every (D, dtype, causal) of kTuned also has a kDefaults entry, so a tuned shape on another
//   GPU still launches.
#ifndef FA2TUNE_EXPORTED_HEADER_
#define FA2TUNE_EXPORTED_HEADER_

#include "fa2_fwd.cuh"
// fa2_fwd.cuh defines Fa2Params; fa_params.cuh (included by the fa3 family) then checks that
// it is the same struct, byte for byte, instead of defining it again.
#define FA2TUNE_FA2PARAMS_DEFINED
#include "fa_abi.cuh"
#include "fa3_launch.cuh"
#include "fa2_gpu_name.cuh"

#include <atomic>
#include <cstdint>
#include <cstring>

// The values are part of the API (stable across exports): never renumber.
enum fa2tune_dtype : int { FA2TUNE_FP16 = 0, FA2TUNE_BF16 = 1 };

namespace fa2tune_detail {

using LaunchFn = cudaError_t (*)(const Fa2Params&, cudaStream_t);
using AcceptsFn = bool (*)(const Fa2Params&);

struct Choice {
  long long n;  // the N this config was tuned at (0 for a default)
  LaunchFn launch;
  const char* name;
  AcceptsFn accepts;  // whether `launch` can run p on the current device; nullptr: always
};

struct Table {
  int d;
  int dtype;  // an fa2tune_dtype value
  bool causal;
  const Choice* choices;  // sorted by n
  int count;
};

}  // namespace fa2tune_detail

#include "fa2_dispatch_table.inc"

namespace fa2tune_detail {

// Whether the current device is the tuned GPU. cudaGetDeviceProperties is slow, so the
// answer is cached per device ordinal (0 = not looked up yet, 1 = tuned GPU, 2 = other).
inline bool on_tuned_gpu() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  const bool cacheable = dev >= 0 && dev < kMaxDevices;
  if (cacheable) {
    const int hit = cache[dev].load(std::memory_order_relaxed);
    if (hit != 0) return hit == 1;
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return false;
  char key[sizeof(prop.name) + 1];
  normalise_name(prop.name, key, sizeof(key));
  const bool match = std::strcmp(key, kTunedGpu) == 0;
  if (cacheable) cache[dev].store(match ? 1 : 2, std::memory_order_relaxed);
  return match;
}

// The config tuned at the N nearest to n on a log scale: n^2 is compared with the product of
// neighbouring tuned Ns, i.e. the boundaries are their geometric midpoints (exact in int64).
// The service's /v1/best picks the same N (tests/test_export.py checks both agree).
inline const Choice* bucket(const Table& t, long long n2) {
  int i = 0;
  while (i + 1 < t.count && n2 >= t.choices[i].n * t.choices[i + 1].n) ++i;
  return &t.choices[i];
}

// Whether a choice can run p here: its family's guard (fa3::can_launch: compute capability
// 9.0 and an sm_90a image, cached per device; strides TMA can address), if it has one.
inline bool accepts(const Choice& c, const Fa2Params& p) {
  return c.accepts == nullptr || c.accepts(p);
}

// Tuned tables first (on the tuned GPU only), then the defaults; nullptr for a head dim,
// dtype or mask this header has no config for. A tuned choice that cannot run here (an fa3
// config on a GPU that is not cc 9.0, or in a program built without sm_90a) gives way to the
// default.
inline const Choice* select(const Fa2Params& p, int head_dim, int dtype, bool causal) {
  if (kTunedCount > 0 && on_tuned_gpu()) {
    const long long n2 = static_cast<long long>(p.nq) * static_cast<long long>(p.nk);
    for (int i = 0; i < kTunedCount; ++i) {
      const Table& t = kTuned[i];
      if (t.d == head_dim && t.dtype == dtype && t.causal == causal) {
        const Choice* c = bucket(t, n2);
        if (accepts(*c, p)) return c;
        break;
      }
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
inline bool valid(const Fa2Params& p) { return fa2tune_abi::valid(p); }

}  // namespace fa2tune_detail

// ------------------------------------------------------------------------------------------
// Public entry points (see the top of this part).

inline const char* fa2tune_config_name(const Fa2Params& p, int head_dim, fa2tune_dtype dtype,
                                       bool causal) {
  if (!fa2tune_detail::valid(p)) return nullptr;
  const fa2tune_detail::Choice* c =
      fa2tune_detail::select(p, head_dim, static_cast<int>(dtype), causal);
  return c == nullptr ? nullptr : c->name;
}

inline cudaError_t fa2tune_forward(const Fa2Params& p, int head_dim, fa2tune_dtype dtype,
                                   bool causal, cudaStream_t stream = 0) {
  if (!fa2tune_detail::valid(p)) return cudaErrorInvalidValue;
  const fa2tune_detail::Choice* c =
      fa2tune_detail::select(p, head_dim, static_cast<int>(dtype), causal);
  if (c == nullptr) return cudaErrorInvalidValue;
  return c->launch(p, stream);
}

#endif  // FA2TUNE_EXPORTED_HEADER_
