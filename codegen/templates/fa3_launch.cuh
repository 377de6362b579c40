// fa2tune: the exported header's host side of the Hopper family "fa3" (fa3_fwd.cuh): a kernel
// template that can be explicitly instantiated per config, and its launcher, which builds the
// three TMA descriptors (docs/fa3_kernel.md, "ABI") from the FaParams of a launch.
//
//   template <class T> __global__ void fa3::fwd_kernel(FaParams, CUtensorMap q, k, v);
//   template <class T> cudaError_t fa3::launch(const FaParams&, cudaStream_t);
//       cudaErrorInvalidValue      parameters the kernel or TMA cannot take (see valid_params);
//       cudaErrorNotSupported      the current device is not of compute capability 9.0;
//       cudaErrorNoKernelImageForDevice  the program was not compiled for sm_90a (below);
//       otherwise the launch's status.
//   template <class T> bool fa3::can_launch(const FaParams&);
//       whether launch<T> would launch: the dispatch asks before it picks an fa3 config and
//       takes FlashAttention-2's default otherwise.
//
// Packed variable-length configs (`_vl`, T::Varlen; docs/fa3_kernel.md "Varlen"):
//   template <class T> __global__ void fa3::fwd_varlen_kernel(FaParams, fa3::VarlenArgs,
//                                                             CUtensorMap q, k, v);
//   template <class T> cudaError_t fa3::launch_varlen(const FaParams&, const FaVarlen&,
//                                                      cudaStream_t);
//       p as the dispatch's varlen_params makes it (batch = sequences, nq/nk the longest,
//       batch strides unused), at most 65,535 sequences (the dispatch slices larger batches
//       and passes each slice's offsets). FaVarlen.reserved carries total_k, the packed
//       K/V row count (cu_seqlens_k[batch] of the whole batch): the K and V descriptors are
//       bounded by it and the kernel never reads it, so it travels in the struct's spare
//       field instead of changing the ABI struct (fa_params.cuh, hashed into shipped builds).
//       cudaErrorInvalidValue also when total_k < p.nk (the 0 of a caller that left
//       reserved unset, unless no sequence has keys) or total_k < 0; otherwise as launch.
//   template <class T> bool fa3::can_launch_varlen(const FaParams&, const FaVarlen&);
//       as can_launch, for the varlen kernel and the packed tensors' views. It does not
//       judge total_k (it assumes a valid one): a call that gives none is refused by
//       launch_varlen rather than silently passed over to a slower config.
//
// Attention-variant configs (T::kVariant: a `_loc`, `_cap` or `_snk` switch; docs/variants.md):
// the kernels take FaVariant (fa_params.cuh) as their last argument.
//   template <class T> __global__ void fa3::fwd_variant_kernel(FaParams, CUtensorMap q, k, v,
//                                                              FaVariant);
//   template <class T> __global__ void fa3::fwd_varlen_variant_kernel(FaParams,
//                                                     fa3::VarlenArgs, CUtensorMap q, k, v,
//                                                     FaVariant);
//   template <class T> cudaError_t fa3::launch_variant(const FaParams&, const FaVariant&,
//                                                      cudaStream_t);
//   template <class T> cudaError_t fa3::launch_varlen_variant(const FaParams&, const FaVarlen&,
//                                                             const FaVariant&, cudaStream_t);
//       as launch / launch_varlen; cudaErrorInvalidValue also for a variant the kernel cannot
//       take (valid_variant<T>: a window bound below -1, a negative chunk, a softcap
//       kernel's cap not above 0). A sinks kernel given no sink pointer computes plain
//       attention. can_launch<T> / can_launch_varlen<T> are the guards of these configs too.
//
// Targets. The kernels need sm_90a (wgmma, setmaxnreg): compile with
//   -gencode=arch=compute_90a,code=sm_90a
// alone or next to other targets (-gencode=arch=compute_80,code=sm_80 ...). On every other
// target the kernel bodies compile to a stub, so the header builds for any sm_80+ target list.
// A stub is never launched: it declares a static shared-memory marker of kStubMarkerBytes
// (the real kernel has dynamic shared memory only), and launch() reads the loaded image's
// attributes (cudaFuncGetAttributes, once per kernel and device) and refuses a stub. That
// catches the builds that would otherwise run one on an H200: -arch=sm_90 (an sm_90 cubin,
// not sm_90a) or PTX of an older target JIT-compiled by the driver.
//
// No -lcuda: cuTensorMapEncodeTiled is a driver function, obtained once through the runtime's
// cudaGetDriverEntryPointByVersion (CUDA 12.5+; cudaGetDriverEntryPoint before that).
//
// Not a header to include on its own: dispatch.cuh includes it (and codegen/export.py
// inlines it) only when the exported header holds fa3 configs.
#pragma once

#include <cuda.h>  // CUtensorMap, cuTensorMapEncodeTiled's types (no driver library needed)
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

// FaVarlen, the argument type of the varlen launcher the dispatch table points at.
#include "fa_params.cuh"

// fa3_fwd.cuh stops any device compilation for a target without the sm_90a features
// (#error) unless FA3_TEMPLATES_ONLY is defined. Here only the kernel bodies below need sm_90a
// and they are guarded (FA3_LAUNCH_SM90A_), so the macro is defined while fa3_fwd.cuh is read.
// Nothing of fa3_fwd.cuh is compiled for the other targets: it only defines templates and
// __forceinline__ functions, which nothing instantiates or calls there. (This header used to
// define nvcc's own feature macro, __CUDA_ARCH_FEAT_SM90_ALL, for those passes: a
// compiler-reserved name; now only nvcc defines it and this file only reads it.)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA3_LAUNCH_SM90A_ 1  // this pass compiles device code for sm_90a
#endif
#define FA3_TEMPLATES_ONLY 1
#include "fa3_fwd.cuh"
#undef FA3_TEMPLATES_ONLY
#include "fa_abi.cuh"

namespace fa3 {

// Static shared memory of the stub kernel (other targets); the real kernel has none.
constexpr int kStubMarkerBytes = 32 * 1024;

template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    fwd_kernel(const FaParams p, const __grid_constant__ CUtensorMap tma_q,
               const __grid_constant__ CUtensorMap tma_k,
               const __grid_constant__ CUtensorMap tma_v) {
  static_assert(!T::Varlen, "varlen configs take VarlenArgs: fwd_varlen_kernel");
  static_assert(!T::kVariant, "variant configs take FaVariant: fwd_variant_kernel");
#if defined(FA3_LAUNCH_SM90A_)
  fwd_body<T>(p, &tma_q, &tma_k, &tma_v);  // as FA3_DEFINE_KERNEL
#elif defined(__CUDA_ARCH__)
  // Another target: a stub, refused by launch() (see the top). Should it run anyway, it traps
  // rather than return without writing O.
  __shared__ unsigned char stub_marker[kStubMarkerBytes];
  reinterpret_cast<volatile unsigned char*>(stub_marker)[threadIdx.x % kStubMarkerBytes] = 0;
  __trap();
#endif
}

// The packed variable-length kernel (FA3_DEFINE_VARLEN_KERNEL's body): VarlenArgs (FaVarlen's
// bytes) before the descriptors, which are over the packed [1, total, heads, D] tensors.
template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    fwd_varlen_kernel(const FaParams p, const VarlenArgs vl,
                      const __grid_constant__ CUtensorMap tma_q,
                      const __grid_constant__ CUtensorMap tma_k,
                      const __grid_constant__ CUtensorMap tma_v) {
  static_assert(T::Varlen, "dense configs take the descriptors only: fwd_kernel");
  static_assert(!T::kVariant, "variant configs take FaVariant: fwd_varlen_variant_kernel");
#if defined(FA3_LAUNCH_SM90A_)
  fwd_body<T>(p, &tma_q, &tma_k, &tma_v, vl);
#elif defined(__CUDA_ARCH__)
  // Another target: a stub, refused by launch_varlen() like fwd_kernel's.
  __shared__ unsigned char stub_marker[kStubMarkerBytes];
  reinterpret_cast<volatile unsigned char*>(stub_marker)[threadIdx.x % kStubMarkerBytes] = 0;
  __trap();
#endif
}

// The kernels of variant configs (FA3_DEFINE_VARIANT_KERNEL's bodies): the plain kernels'
// arguments, then FaVariant.
template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    fwd_variant_kernel(const FaParams p, const __grid_constant__ CUtensorMap tma_q,
                       const __grid_constant__ CUtensorMap tma_k,
                       const __grid_constant__ CUtensorMap tma_v, const FaVariant var) {
  static_assert(!T::Varlen && T::kVariant, "a dense variant config");
#if defined(FA3_LAUNCH_SM90A_)
  fwd_body<T>(p, &tma_q, &tma_k, &tma_v, VarlenArgs{}, var);
#elif defined(__CUDA_ARCH__)
  __shared__ unsigned char stub_marker[kStubMarkerBytes];  // a stub, as fwd_kernel's
  reinterpret_cast<volatile unsigned char*>(stub_marker)[threadIdx.x % kStubMarkerBytes] = 0;
  __trap();
#endif
}

template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    fwd_varlen_variant_kernel(const FaParams p, const VarlenArgs vl,
                              const __grid_constant__ CUtensorMap tma_q,
                              const __grid_constant__ CUtensorMap tma_k,
                              const __grid_constant__ CUtensorMap tma_v, const FaVariant var) {
  static_assert(T::Varlen && T::kVariant, "a varlen variant config");
#if defined(FA3_LAUNCH_SM90A_)
  fwd_body<T>(p, &tma_q, &tma_k, &tma_v, vl, var);
#elif defined(__CUDA_ARCH__)
  __shared__ unsigned char stub_marker[kStubMarkerBytes];  // a stub, as fwd_kernel's
  reinterpret_cast<volatile unsigned char*>(stub_marker)[threadIdx.x % kStubMarkerBytes] = 0;
  __trap();
#endif
}

namespace launch_detail {

constexpr int kMaxDevices = 64;
constexpr int kBoxCols = 64;                     // one 128-byte swizzle row of 2-byte elements
constexpr uint64_t kMaxTmaStride = 1ull << 40;  // TMA: byte strides below 2^40
constexpr int64_t kElemBytes = 2;               // fp16 and bf16

// Device ordinal of the current device, or -1.
inline int current_device() {
  int dev = -1;
  return cudaGetDevice(&dev) == cudaSuccess ? dev : -1;
}

// Whether `dev` is of compute capability 9.0 (an sm_90a cubin runs on exactly that), cached
// per device ordinal (0 = not looked up yet, 1 = yes, 2 = no).
inline bool is_cc90(int dev) {
  static std::atomic<int> cache[kMaxDevices];
  const bool cacheable = dev >= 0 && dev < kMaxDevices;
  if (cacheable) {
    const int hit = cache[dev].load(std::memory_order_relaxed);
    if (hit != 0) return hit == 1;
  }
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  const bool yes = major == 9 && minor == 0;
  if (cacheable) cache[dev].store(yes ? 1 : 2, std::memory_order_relaxed);
  return yes;
}

// The kernel a config compiles to: fwd_varlen_kernel for a varlen Traits, else fwd_kernel,
// or their variant twins for a variant Traits (only the one taken is instantiated).
template <class T>
constexpr auto kernel_of() {
  if constexpr (T::kVariant && T::Varlen)
    return &fwd_varlen_variant_kernel<T>;
  else if constexpr (T::kVariant)
    return &fwd_variant_kernel<T>;
  else if constexpr (T::Varlen)
    return &fwd_varlen_kernel<T>;
  else
    return &fwd_kernel<T>;
}

// Whether a variant config's kernel can take `var`: window bounds of -1 (none) or more, a
// chunk of 0 (none) or more, and for a softcap kernel a cap above 0 (it divides by it). The
// switches a kernel lacks leave their fields unread.
template <class T>
bool valid_variant(const FaVariant& var) {
  if (T::Local && (var.window_left < -1 || var.window_right < -1 || var.chunk < 0)) return false;
  if (T::Softcap && !(var.softcap > 0.f)) return false;
  return true;
}

// Per kernel and device, once: the device is cc 9.0, the image the runtime loaded for
// kernel_of<T>() is the sm_90a one (not the stub), and the kernel may use T::kSmemBytes of
// dynamic shared memory. cudaSuccess or the reason why not.
//
// The cache is a function-local static of a template, which g++ makes one object per process
// (STB_GNU_UNIQUE), shared by every library holding this header, even ones loaded with
// RTLD_LOCAL. Two builds of one config (an sm_90a and a plain sm_90 library in one process)
// have different kernels but would share the slot, so a slot names the kernel it was filled
// for and only that kernel's lookups use it. (The header's data tables are static, one copy
// per library, for the same reason: codegen/cpp_text.py's DATA_DECL.)
struct PrepareSlot {
  std::atomic<const void*> kernel{nullptr};
  std::atomic<int> result{0};  // 0 = not yet, else the cudaError_t + 1
};

template <class T>
cudaError_t prepare(int dev) {
  static PrepareSlot cache[kMaxDevices];
  if (dev < 0) return cudaErrorInvalidDevice;
  const bool cacheable = dev < kMaxDevices;
  const void* kernel = reinterpret_cast<const void*>(kernel_of<T>());
  if (cacheable && cache[dev].kernel.load(std::memory_order_acquire) == kernel) {
    const int hit = cache[dev].result.load(std::memory_order_acquire);
    // Re-read: another library may have refilled the slot between the two loads.
    if (hit != 0 && cache[dev].kernel.load(std::memory_order_acquire) == kernel)
      return static_cast<cudaError_t>(hit - 1);
  }
  cudaError_t err = cudaSuccess;
  if (!is_cc90(dev)) {
    err = cudaErrorNotSupported;
  } else {
    cudaFuncAttributes attr{};
    err = cudaFuncGetAttributes(&attr, kernel_of<T>());
    if (err == cudaSuccess && attr.sharedSizeBytes >= static_cast<size_t>(kStubMarkerBytes))
      err = cudaErrorNoKernelImageForDevice;  // the stub: not compiled for sm_90a
    if (err == cudaSuccess)
      err = cudaFuncSetAttribute(kernel_of<T>(), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 T::kSmemBytes);
  }
  if (cacheable) {
    cache[dev].kernel.store(nullptr, std::memory_order_release);  // invalid while refilled
    cache[dev].result.store(static_cast<int>(err) + 1, std::memory_order_release);
    cache[dev].kernel.store(kernel, std::memory_order_release);
  }
  return err;
}

// One tensor's TMA view: dims (D, N, H, B) innermost first, byte strides (row, head, batch).
struct TensorView {
  void* ptr;
  uint64_t dims[4];
  uint64_t strides[3];
};

// The view of a [B, N, H, D]-like tensor given by element strides; false when TMA cannot
// address it. As measure/tma.py's dims_and_strides (the GPU stage's descriptors): a dimension
// of extent 1 is never stepped over, so it gets the stride a dense tensor would have, rounded
// up to 16 bytes. Other strides must be positive (TMA has no negative or zero, broadcast,
// strides). N = 0 (no keys) is encoded as one row: the kernel loads no K/V tile then.
inline bool tensor_view(const void* ptr, int d, int n, int h, int b, int64_t row, int64_t head,
                        int64_t batch, TensorView* out) {
  const int64_t dims[4] = {d, n > 0 ? n : 1, h, b};
  int64_t strides[3] = {row * kElemBytes, head * kElemBytes, batch * kElemBytes};
  for (int i = 0; i < 3; ++i) {
    if (dims[i + 1] == 1) {
      const int64_t dense = i == 0 ? dims[0] * kElemBytes : dims[i] * strides[i - 1];
      strides[i] = dense > 16 ? (dense + 15) / 16 * 16 : 16;
    }
    if (strides[i] <= 0 || strides[i] % 16 != 0 ||
        static_cast<uint64_t>(strides[i]) >= kMaxTmaStride)
      return false;  // negative or zero (broadcast) strides: TMA has none
  }
  out->ptr = const_cast<void*>(ptr);
  for (int i = 0; i < 4; ++i) out->dims[i] = static_cast<uint64_t>(dims[i]);
  for (int i = 0; i < 3; ++i) out->strides[i] = static_cast<uint64_t>(strides[i]);
  return true;
}

// The parameters of a launch of fwd_kernel<T>, and the TMA views of Q, K and V; false for
// parameters it cannot take: those fa2's ABI refuses (null or misaligned pointers, strides
// not multiples of 8 elements, partial GQA groups, grid limits) and strides TMA cannot
// express.
inline bool tma_views(const FaParams& p, int d, TensorView* q, TensorView* k, TensorView* v) {
  if (!fa2tune_abi::valid(p)) return false;
  return tensor_view(p.q, d, p.nq, p.q_heads, p.batch, p.q_row_stride, p.q_head_stride,
                     p.q_batch_stride, q) &&
         tensor_view(p.k, d, p.nk, p.kv_heads, p.batch, p.k_row_stride, p.k_head_stride,
                     p.k_batch_stride, k) &&
         tensor_view(p.v, d, p.nk, p.kv_heads, p.batch, p.v_row_stride, p.v_head_stride,
                     p.v_batch_stride, v);
}

// The TMA views of a packed launch's Q, K and V, as measure/tma.py's fa3_varlen_tensor_maps:
// each tensor [total, heads, D] seen as [1, total, heads, D], so (D, total, heads, 1) with
// the row and head strides of p and a synthetic batch stride (extent 1). total_k bounds K
// and V (rows past it read as zeros; with no keys at all it is encoded as one row, never
// loaded). False as tma_views, or for a total_k below p.nk (or negative).
inline bool varlen_views(const FaParams& p, int d, int total_q, int total_k, TensorView* q,
                         TensorView* k, TensorView* v) {
  if (!fa2tune_abi::valid(p)) return false;
  if (total_q < p.nq || total_k < p.nk || total_k < 0) return false;
  return tensor_view(p.q, d, total_q, p.q_heads, 1, p.q_row_stride, p.q_head_stride, 0, q) &&
         tensor_view(p.k, d, total_k, p.kv_heads, 1, p.k_row_stride, p.k_head_stride, 0, k) &&
         tensor_view(p.v, d, total_k, p.kv_heads, 1, p.v_row_stride, p.v_head_stride, 0, v);
}

// cuTensorMapEncodeTiled from the driver, looked up once (nullptr when the driver lacks it).
using EncodeTiledFn = decltype(&cuTensorMapEncodeTiled);

inline EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn = []() -> EncodeTiledFn {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    // The ABI of cuTensorMapEncodeTiled as introduced in CUDA 12.0.
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr,
                                                             12000, cudaEnableDefault, &found);
#else
    const cudaError_t err =
        cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &ptr, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) return nullptr;
    return reinterpret_cast<EncodeTiledFn>(ptr);
  }();
  return fn;
}

// The 4-d tiled descriptor of one tensor: box (64, rows, 1, 1), 128-byte swizzle, zero fill
// out of bounds, 256-byte L2 promotion (measure/tma.py and bench/hopper/fa3_host.py
// encode_tensor_map).
template <class Elem>
cudaError_t encode(const TensorView& t, int rows, CUtensorMap* map) {
  const EncodeTiledFn fn = encode_tiled();
  if (fn == nullptr) return cudaErrorNotSupported;
  const CUtensorMapDataType type = std::is_same_v<Elem, __half>
                                       ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                       : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuuint64_t dims[4] = {t.dims[0], t.dims[1], t.dims[2], t.dims[3]};
  const cuuint64_t strides[3] = {t.strides[0], t.strides[1], t.strides[2]};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(kBoxCols), static_cast<cuuint32_t>(rows),
                             1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult res = fn(map, type, 4, t.ptr, dims, strides, box, elem_strides,
                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return res == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// The three descriptors of a launch of T: Q in BlockM-row boxes, K and V in BlockN-row boxes.
template <class T>
cudaError_t encode_all(const TensorView& q, const TensorView& k, const TensorView& v,
                       CUtensorMap* tma_q, CUtensorMap* tma_k, CUtensorMap* tma_v) {
  using Elem = typename T::Elem;
  cudaError_t err;
  if ((err = encode<Elem>(q, T::BlockM, tma_q)) != cudaSuccess) return err;
  if ((err = encode<Elem>(k, T::BlockN, tma_k)) != cudaSuccess) return err;
  return encode<Elem>(v, T::BlockN, tma_v);
}

}  // namespace launch_detail

template <class T>
bool can_launch(const FaParams& p) {
  launch_detail::TensorView q, k, v;
  if (!launch_detail::tma_views(p, T::D, &q, &k, &v)) return false;
  return launch_detail::prepare<T>(launch_detail::current_device()) == cudaSuccess;
}

template <class T>
cudaError_t launch(const FaParams& p, cudaStream_t stream) {
  launch_detail::TensorView q, k, v;
  if (!launch_detail::tma_views(p, T::D, &q, &k, &v)) return cudaErrorInvalidValue;
  cudaError_t err = launch_detail::prepare<T>(launch_detail::current_device());
  if (err != cudaSuccess) return err;
  CUtensorMap tma_q, tma_k, tma_v;
  if ((err = launch_detail::encode_all<T>(q, k, v, &tma_q, &tma_k, &tma_v)) != cudaSuccess)
    return err;
  const dim3 grid((p.nq + T::BlockM - 1) / T::BlockM, p.q_heads, p.batch);
  fwd_kernel<T><<<grid, T::kThreads, T::kSmemBytes, stream>>>(p, tma_q, tma_k, tma_v);
  return cudaGetLastError();
}

template <class T>
bool can_launch_varlen(const FaParams& p, const FaVarlen& vl) {
  static_assert(T::Varlen, "a dense config: can_launch");
  // The views as launch_varlen builds them, given a valid total_k: this guard says whether
  // the config can run here, not whether the call's total_k is right (launch_varlen's).
  const int total_k = vl.reserved > p.nk ? vl.reserved : p.nk;
  launch_detail::TensorView q, k, v;
  if (!launch_detail::varlen_views(p, T::D, vl.total_q, total_k, &q, &k, &v)) return false;
  return launch_detail::prepare<T>(launch_detail::current_device()) == cudaSuccess;
}

// Descriptors, like launch's, are encoded per launch (a few microseconds on the host): they
// hold the tensors' addresses and row counts, which change from call to call; what is
// cached is what does not (the driver entry point, each kernel's preparation per device).
// Every slice of a large batch (launch_varlen_slices) encodes the same three again.
template <class T>
cudaError_t launch_varlen(const FaParams& p, const FaVarlen& vl, cudaStream_t stream) {
  static_assert(T::Varlen, "a dense config: launch");
  launch_detail::TensorView q, k, v;
  if (!launch_detail::varlen_views(p, T::D, vl.total_q, vl.reserved, &q, &k, &v))
    return cudaErrorInvalidValue;
  if (vl.cu_seqlens_q == nullptr || vl.cu_seqlens_k == nullptr) return cudaErrorInvalidValue;
  cudaError_t err = launch_detail::prepare<T>(launch_detail::current_device());
  if (err != cudaSuccess) return err;
  CUtensorMap tma_q, tma_k, tma_v;
  if ((err = launch_detail::encode_all<T>(q, k, v, &tma_q, &tma_k, &tma_v)) != cudaSuccess)
    return err;
  // The kernel's own name for FaVarlen's bytes; reserved goes as 0, as the GPU stage's
  // launches pass it (measure/varlen.py): total_k was only the host's.
  const VarlenArgs args{vl.cu_seqlens_q, vl.cu_seqlens_k, vl.total_q, 0};
  const dim3 grid((p.nq + T::BlockM - 1) / T::BlockM, p.q_heads, p.batch);
  fwd_varlen_kernel<T><<<grid, T::kThreads, T::kSmemBytes, stream>>>(p, args, tma_q, tma_k,
                                                                      tma_v);
  return cudaGetLastError();
}

// The variant twins of launch and launch_varlen (the top: FaVariant travels by value as the
// kernels' last argument; the descriptors are those of the plain kernels).
template <class T>
cudaError_t launch_variant(const FaParams& p, const FaVariant& var, cudaStream_t stream) {
  static_assert(!T::Varlen && T::kVariant, "a dense variant config");
  if (!launch_detail::valid_variant<T>(var)) return cudaErrorInvalidValue;
  launch_detail::TensorView q, k, v;
  if (!launch_detail::tma_views(p, T::D, &q, &k, &v)) return cudaErrorInvalidValue;
  cudaError_t err = launch_detail::prepare<T>(launch_detail::current_device());
  if (err != cudaSuccess) return err;
  CUtensorMap tma_q, tma_k, tma_v;
  if ((err = launch_detail::encode_all<T>(q, k, v, &tma_q, &tma_k, &tma_v)) != cudaSuccess)
    return err;
  const dim3 grid((p.nq + T::BlockM - 1) / T::BlockM, p.q_heads, p.batch);
  fwd_variant_kernel<T><<<grid, T::kThreads, T::kSmemBytes, stream>>>(p, tma_q, tma_k, tma_v,
                                                                       var);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_varlen_variant(const FaParams& p, const FaVarlen& vl, const FaVariant& var,
                                  cudaStream_t stream) {
  static_assert(T::Varlen && T::kVariant, "a varlen variant config");
  if (!launch_detail::valid_variant<T>(var)) return cudaErrorInvalidValue;
  launch_detail::TensorView q, k, v;
  if (!launch_detail::varlen_views(p, T::D, vl.total_q, vl.reserved, &q, &k, &v))
    return cudaErrorInvalidValue;
  if (vl.cu_seqlens_q == nullptr || vl.cu_seqlens_k == nullptr) return cudaErrorInvalidValue;
  cudaError_t err = launch_detail::prepare<T>(launch_detail::current_device());
  if (err != cudaSuccess) return err;
  CUtensorMap tma_q, tma_k, tma_v;
  if ((err = launch_detail::encode_all<T>(q, k, v, &tma_q, &tma_k, &tma_v)) != cudaSuccess)
    return err;
  const VarlenArgs args{vl.cu_seqlens_q, vl.cu_seqlens_k, vl.total_q, 0};  // as launch_varlen
  const dim3 grid((p.nq + T::BlockM - 1) / T::BlockM, p.q_heads, p.batch);
  fwd_varlen_variant_kernel<T><<<grid, T::kThreads, T::kSmemBytes, stream>>>(
      p, args, tma_q, tma_k, tma_v, var);
  return cudaGetLastError();
}

}  // namespace fa3
