// fa2tune: FlashAttention-2 forward kernel template (sm_80+, mma.sync m16n8k16, fp32 accumulate).
//
// One thread block computes Br query rows of one (batch, head); its warps split those rows
// (split-Q), so the online softmax of a row never leaves its warp. K and V tiles of Bc rows
// stream through shared memory with cp.async; `Stages` buffers each let loads run ahead of
// the tensor cores. Everything that shapes the code is a template parameter; everything that
// shapes the problem (batch, heads, lengths, strides, scale) is a run-time field of FaParams.
//
// Masking: key tiles past the end (N % Bc != 0) and, when causal, keys past the diagonal are
// set to -inf before the softmax; tiles wholly above the diagonal are never loaded. Causal is
// bottom-right aligned as in FlashAttention-2: query i sees key j iff j <= i + nk - nq. A row
// that sees no key gets O = 0 and LSE = -inf, never NaN.
//
// Head dims: any multiple of 8 up to 256. The tile's D is the head dim rounded up to a multiple
// of 32 (FlashAttention-2 rounds the same way); the extra columns are zero-filled on load, so
// they add nothing to Q K^T, and P V's extra output columns are never stored.
//
// Variable lengths (Varlen): Q, K, V and O are packed, one row per token of every sequence
// ([total, heads, D]); FaVarlen's cumulative offsets say where each sequence starts. FaParams
// then holds the longest lengths (nq, nk: they size the grid), batch is the number of
// sequences and the batch strides are unused; LSE is [q_heads, total_q].
//
// Attention variants (Local, Softcap, Sinks: off by default, so plain kernels keep their code
// and arguments): a variant kernel takes FaVariant as its last argument. Local masks with
// fa::LocalMask (a window and/or a chunk); its first key tile n_block_min is above 0, so the
// key loop and the cp.async pipeline start there and a window's cost follows the keys it
// sees. Softcap transforms S after the GEMM (fa::SoftcapScore) and changes the softmax's
// scale; Sinks starts each row's running max at its head's sink logit and its running sum at
// 1, so O and LSE include the sink's term of the denominator (docs/variants.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#ifndef __CUDACC_RTC__  // NVRTC: the device built-ins need no header
#include <cuda_runtime.h>
#endif

#include <cstdint>

#include "fa_mask.cuh"     // mask and score policies
#include "fa_mma.cuh"      // mma.sync, ldmatrix, cp.async
#include "fa_params.cuh"   // FaParams, FaVarlen
#include "fa_softmax.cuh"  // the online softmax

namespace fa2 {

// The shared building blocks, by their names in this family (splitkv_fwd.cuh reads fa's).
using fa::cp_async_16;
using fa::cp_async_commit;
using fa::cp_async_wait;
using fa::ElemOps;
using fa::fast_exp2;
using fa::ldmatrix_x4;
using fa::ldmatrix_x4_trans;
using fa::smem_u32;

// ---------------------------------------------------------------------------------------------
// Every constant of one instantiation, derived from its parameters and checked here.
template <int DHead_, typename Elem_, bool Causal_, int Br_, int Bc_, int Warps_, int Stages_,
          int Pad_, bool Swizzle_, bool Varlen_ = false, bool Local_ = false,
          bool Softcap_ = false, bool Sinks_ = false>
struct Traits {
  using Elem = Elem_;
  static constexpr int DHead = DHead_;            // the head dim of the tensors
  static constexpr int D = (DHead_ + 31) / 32 * 32;  // the tile's: rounded up to 32
  static constexpr bool Varlen = Varlen_;
  static constexpr bool Causal = Causal_;
  static constexpr bool Local = Local_;      // window / chunk mask (fa::LocalMask)
  static constexpr bool Softcap = Softcap_;  // tanh logit cap (fa::SoftcapScore)
  static constexpr bool Sinks = Sinks_;      // per-head sink logits in the denominator
  static constexpr bool kVariant = Local || Softcap || Sinks;  // takes FaVariant
  static constexpr int Br = Br_;
  static constexpr int Bc = Bc_;
  static constexpr int Warps = Warps_;
  static constexpr int Stages = Stages_;
  static constexpr int Pad = Pad_;
  static constexpr bool Swizzle = Swizzle_;

  static constexpr int kThreads = 32 * Warps;
  static constexpr int kWarpRows = Br / Warps;    // query rows owned by one warp
  static constexpr int kMTiles = kWarpRows / 16;  // 16-row mma tiles per warp
  static constexpr int kSTiles = Bc / 8;          // 8-column tiles of S per m-tile
  static constexpr int kOTiles = D / 8;           // 8-column tiles of O per m-tile
  static constexpr int kChunks = D / 8;           // 16-byte chunks per smem row
  static constexpr int kHeadChunks = DHead / 8;   // ... of them holding the tensors' data
  static constexpr int kRowElems = D + Pad;
  static constexpr int kQElems = Br * kRowElems;
  static constexpr int kKVElems = Bc * kRowElems;
  static constexpr int kSmemBytes = (Br + 2 * Stages * Bc) * kRowElems * 2;
  // Q fragments stay in registers when they are cheap; otherwise re-read per tile (FA2 does).
  static constexpr int kAccRegs = kWarpRows * (D + Bc) / 32;  // fp32 O and S per thread
  static constexpr int kQRegs = kMTiles * (D / 16) * 4;
  static constexpr bool kQInRegs = kQRegs <= 32 && kAccRegs + kQRegs <= 160;

  static_assert(DHead % 8 == 0 && DHead >= 8 && DHead <= 256,
                "head dim must be 8..256, multiple of 8");
  static_assert(Br % (16 * Warps) == 0, "each warp needs whole 16-row mma tiles");
  static_assert(Bc % 16 == 0 && Bc >= 16, "Bc must be a multiple of 16");
  static_assert(Stages >= 1 && Stages <= 4, "1..4 K/V stages");
  static_assert(!(Swizzle && Pad != 0), "swizzle and padding are alternatives");
  static_assert(Pad % 8 == 0, "padding keeps rows 16-byte aligned");
  static_assert(!Swizzle || kChunks % 4 == 0, "swizzle needs a multiple of 4 chunks per row");

  // Element offset of 16-byte chunk `c` of smem row `r`. The XOR swizzle permutes chunks so
  // that the 8 rows an ldmatrix phase reads fall in 8 different 16-byte bank groups.
  static __device__ __forceinline__ int offset(int r, int c) {
    if constexpr (Swizzle) {
      if constexpr (kChunks % 8 == 0) {
        c ^= (r & 7);
      } else {  // 64-byte or 192-byte rows: two rows span one 128-byte bank cycle
        c ^= ((r >> 1) & 3);
      }
    }
    return r * kRowElems + c * 8;
  }

  // The same offset split for fragment loads, whose rows are row0 + 16*i and whose chunks are
  // 2*cp + lane_chunk with i and cp compile-time. The swizzle term of such a row depends only
  // on row0, so each thread keeps one small integer and every address is a base plus an
  // immediate; without this the compiler keeps one address register per (i, cp) pair.
  static __device__ __forceinline__ int frag_lane_term(int row0, int lane_chunk) {
    if constexpr (!Swizzle) {
      return lane_chunk;
    } else if constexpr (kChunks % 8 == 0) {
      return lane_chunk ^ (row0 & 7);
    } else {
      return lane_chunk ^ ((row0 >> 1) & 3);
    }
  }
  static __device__ __forceinline__ int frag_chunk_offset(int cp, int lane_term) {
    if constexpr (!Swizzle) {
      return (2 * cp + lane_term) * 8;
    } else if constexpr (kChunks % 8 == 0) {
      return ((2 * cp & ~7) + ((2 * cp & 7) ^ lane_term)) * 8;
    } else {
      return ((2 * cp & ~3) + ((2 * cp & 3) ^ lane_term)) * 8;
    }
  }
};

// Copies `rows` (a compile-time tile height) rows of D elements to smem; rows at and past
// `valid_rows`, and the chunks past the head dim, are zero-filled so that no garbage (NaN bit
// patterns) reaches the mma.
template <class T, int Rows>
__device__ __forceinline__ void load_tile(typename T::Elem* smem, const typename T::Elem* gmem,
                                          int64_t row_stride, int valid_rows, int tid) {
  if constexpr (T::kThreads % T::kChunks == 0) {
    // Each thread keeps one chunk column and walks down the rows, so its global address
    // advances by a fixed stride and its smem offset by a compile-time constant; this keeps
    // the per-iteration 64-bit addresses out of the register file.
    constexpr int kRowsPerIter = T::kThreads / T::kChunks;
    constexpr int kIters = (Rows + kRowsPerIter - 1) / kRowsPerIter;
    const int r0 = tid / T::kChunks;
    const int c = tid % T::kChunks;
    const typename T::Elem* src = gmem + r0 * row_stride + c * 8;
    const int64_t step = kRowsPerIter * row_stride;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int r = r0 + it * kRowsPerIter;
      if (Rows % kRowsPerIter == 0 || r < Rows) {
        const bool valid = r < valid_rows && (T::kHeadChunks == T::kChunks || c < T::kHeadChunks);
        cp_async_16(smem_u32(smem + T::offset(r, c)), valid ? src + it * step : gmem,
                    valid ? 16 : 0);
      }
    }
  } else {
    constexpr int kTotal = Rows * T::kChunks;
    constexpr int kIters = (kTotal + T::kThreads - 1) / T::kThreads;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int idx = it * T::kThreads + tid;
      if (kTotal % T::kThreads == 0 || idx < kTotal) {
        const int r = idx / T::kChunks;
        const int c = idx % T::kChunks;
        const bool valid = r < valid_rows && (T::kHeadChunks == T::kChunks || c < T::kHeadChunks);
        cp_async_16(smem_u32(smem + T::offset(r, c)), valid ? gmem + r * row_stride + c * 8 : gmem,
                    valid ? 16 : 0);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// `var` is read only where a variant switch is on (plain kernels pass FaVariant{}).
template <class T>
__device__ __forceinline__ void fwd_body(const FaParams& p, const FaVarlen& vl,
                                         const FaVariant& var) {
  using Elem = typename T::Elem;
  using Ops = ElemOps<Elem>;
  using Mask = fa::VariantMask<T::Causal, T::Local>;
  using Score = fa::ScoreFor<T::Softcap>;
  constexpr int Br = T::Br, Bc = T::Bc, D = T::D, S = T::Stages;
  constexpr int kMT = T::kMTiles, kST = T::kSTiles, kOT = T::kOTiles;
  constexpr float kNegInf = fa::kNegInf;
  constexpr float kLog2e = fa::kLog2e;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Elem* sQ = reinterpret_cast<Elem*>(smem_raw);
  Elem* sK = sQ + T::kQElems;
  Elem* sV = sK + S * T::kKVElems;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;  // row within an 8-row group of the mma fragment
  const int t = lane % 4;  // column pair within the fragment

  // Causal blocks near the bottom do the most work: launch them first.
  const int m_block = T::Causal ? (gridDim.x - 1 - blockIdx.x) : blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int kv_head = head / (p.q_heads / p.kv_heads);
  const int m0 = m_block * Br;

  // This sequence's lengths and where its rows start: the batch strides when dense, the
  // cumulative offsets when packed (the grid covers the longest sequence; shorter ones leave
  // blocks with nothing to do).
  int nq = p.nq, nk = p.nk, sq = 0, sk = 0;
  if constexpr (T::Varlen) {
    sq = vl.cu_seqlens_q[batch];
    sk = vl.cu_seqlens_k[batch];
    nq = vl.cu_seqlens_q[batch + 1] - sq;
    nk = vl.cu_seqlens_k[batch + 1] - sk;
    if (m0 >= nq) return;
  }
  const int q_rows = min(Br, nq - m0);
  const Mask mask(nq, nk, var.window_left, var.window_right, var.chunk);
  // Key tiles [n_begin, n_tiles). A left-bounded mask sizes the range by the block's valid
  // rows (rows past nq only widen it; nothing of theirs is stored); the others start at 0.
  int n_begin = 0;
  int q_last = m0 + Br - 1;
  if constexpr (Mask::kLeftBound) {
    q_last = m0 + q_rows - 1;
    n_begin = mask.n_block_min(m0, Bc);
  }
  const int n_tiles = mask.n_block_max(q_last + 1, Bc);

  // Row offsets: with packed sequences a sequence's rows start at its cumulative offset.
  const int64_t q_seq = T::Varlen ? sq * p.q_row_stride : batch * p.q_batch_stride;
  const int64_t k_seq = T::Varlen ? sk * p.k_row_stride : batch * p.k_batch_stride;
  const int64_t v_seq = T::Varlen ? sk * p.v_row_stride : batch * p.v_batch_stride;
  const int64_t o_seq = T::Varlen ? sq * p.o_row_stride : batch * p.o_batch_stride;
  const Elem* gQ = static_cast<const Elem*>(p.q) + q_seq + head * p.q_head_stride +
                   static_cast<int64_t>(m0) * p.q_row_stride;
  const Elem* gK = static_cast<const Elem*>(p.k) + k_seq + kv_head * p.k_head_stride;
  const Elem* gV = static_cast<const Elem*>(p.v) + v_seq + kv_head * p.v_head_stride;
  Elem* gO = static_cast<Elem*>(p.o) + o_seq + head * p.o_head_stride +
             static_cast<int64_t>(m0) * p.o_row_stride;
  float* gLse = nullptr;
  if (p.lse != nullptr) {
    if constexpr (T::Varlen) {
      gLse = p.lse + static_cast<int64_t>(head) * vl.total_q + sq + m0;
    } else {
      gLse = p.lse + (static_cast<int64_t>(batch) * p.q_heads + head) * p.nq + m0;
    }
  }

  // A sink's logit (natural log) or -inf: what a row that sees no key reports as its LSE.
  float sink = kNegInf;
  if constexpr (T::Sinks) {
    if (var.sinks != nullptr) sink = var.sinks[head];
  }

  if (Mask::kLeftBound ? n_tiles <= n_begin : n_tiles == 0) {  // no row of this block sees a key
    for (int idx = tid; idx < q_rows * T::kHeadChunks; idx += T::kThreads) {
      const int r = idx / T::kHeadChunks, c = idx % T::kHeadChunks;
      *reinterpret_cast<uint4*>(gO + r * p.o_row_stride + c * 8) = make_uint4(0, 0, 0, 0);
    }
    if (gLse != nullptr)
      for (int r = tid; r < q_rows; r += T::kThreads) gLse[r] = sink;
    return;
  }

  auto load_k = [&](int tile) {
    if (tile < n_tiles)
      load_tile<T, Bc>(sK + (tile % S) * T::kKVElems,
                       gK + static_cast<int64_t>(tile) * Bc * p.k_row_stride, p.k_row_stride,
                       nk - tile * Bc, tid);
    cp_async_commit();  // empty groups keep the wait counts below constant
  };
  auto load_v = [&](int tile) {
    if (tile < n_tiles)
      load_tile<T, Bc>(sV + (tile % S) * T::kKVElems,
                       gV + static_cast<int64_t>(tile) * Bc * p.v_row_stride, p.v_row_stride,
                       nk - tile * Bc, tid);
    cp_async_commit();
  };

  // Pipeline: groups are issued in the order Q+K0, V0, K1, V1, ... so before tile j's K is
  // needed exactly 2S-2 younger groups may still be in flight, and the same holds for V.
  // Tiles count from n_begin; tile j lives in buffer j % S, whatever j the range starts at.
  load_tile<T, Br>(sQ, gQ, p.q_row_stride, q_rows, tid);
  for (int s = 0; s < S - 1; ++s) {
    load_k(n_begin + s);
    load_v(n_begin + s);
  }
  load_k(n_begin + S - 1);

  float o_acc[kMT][kOT][4];
  float row_max[kMT][2];
  float row_sum[kMT][2];  // per-thread partial sums; reduced across the quad at the end
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kOT; ++dt)
#pragma unroll
      for (int i = 0; i < 4; ++i) o_acc[mt][dt][i] = 0.f;
    row_max[mt][0] = row_max[mt][1] = kNegInf;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }
  // Read here, where the plain kernels always read the scale (their code stays the same).
  const Score score(p.softmax_scale, var.softcap);
  const float softmax_scale = score.softmax_scale(p.softmax_scale);  // of what apply() left
  if constexpr (T::Sinks) {  // the sink joins as one more term: max at its logit, sum 1 ...
    const float sink_max = fa::sink_row_max(sink, softmax_scale);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row_max[mt][h] = sink_max;
        row_sum[mt][h] = t == 0 ? 1.f : 0.f;  // ... on one thread: sums are reduced over the quad
      }
  }

  const float scale_log2 = softmax_scale * kLog2e;
  const int warp_row0 = warp * T::kWarpRows;
  // ldmatrix lane -> (row, chunk) maps for the A operand (Q), B from K, and B from V^T.
  const int a_row = warp_row0 + (lane % 8) + 8 * ((lane / 8) % 2);
  const int k_row = (lane % 8) + 8 * (lane / 16);
  const int v_row = (lane % 8) + 8 * ((lane / 8) % 2);
  const int a_term = T::frag_lane_term(a_row, lane / 16);
  const int k_term = T::frag_lane_term(k_row, (lane / 8) % 2);
  const int v_term = T::frag_lane_term(v_row, lane / 16);
  const uint32_t sQ_a = smem_u32(sQ + a_row * T::kRowElems);
  const uint32_t sK_b = smem_u32(sK + k_row * T::kRowElems);
  const uint32_t sV_b = smem_u32(sV + v_row * T::kRowElems);
  constexpr int kRowBytes = T::kRowElems * 2;
  constexpr int kTileBytes = T::kKVElems * 2;

  uint32_t q_frag[T::kQInRegs ? kMT : 1][T::kQInRegs ? D / 16 : 1][4];

  if constexpr (T::kQInRegs) {  // Q arrived with K(0): read its fragments once
    cp_async_wait<2 * S - 2>();
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
        ldmatrix_x4(q_frag[mt][ks],
                    sQ_a + mt * 16 * kRowBytes + 2 * T::frag_chunk_offset(ks, a_term));
  }

  // A left-bounded mask's rows see [begin, limit): the same for every tile, so computed once.
  int row_begin[Mask::kLeftBound ? kMT : 1][2], row_limit[Mask::kLeftBound ? kMT : 1][2];
  if constexpr (Mask::kLeftBound) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + warp_row0 + mt * 16 + g + 8 * h;
        row_begin[mt][h] = mask.key_begin(row);
        row_limit[mt][h] = mask.key_limit(row);
      }
  }

  for (int j = n_begin; j < n_tiles; ++j) {
    cp_async_wait<2 * S - 2>();  // K(j) (and Q) landed
    __syncthreads();             // ... for every thread; and all warps finished PV(j-1)
    load_v(j + S - 1);

    // S = Q K^T for this warp's rows and the tile's Bc keys.
    float s_acc[kMT][kST][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kST; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) s_acc[mt][nt][i] = 0.f;

#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t qa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if constexpr (T::kQInRegs) {
#pragma unroll
          for (int i = 0; i < 4; ++i) qa[mt][i] = q_frag[mt][ks][i];
        } else {
          ldmatrix_x4(qa[mt], sQ_a + mt * 16 * kRowBytes + 2 * T::frag_chunk_offset(ks, a_term));
        }
      }
#pragma unroll
      for (int np = 0; np < kST / 2; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, sK_b + (j % S) * kTileBytes + np * 16 * kRowBytes +
                            2 * T::frag_chunk_offset(ks, k_term));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          Ops::mma(s_acc[mt][2 * np], qa[mt], kb[0], kb[1]);
          Ops::mma(s_acc[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }

    score.apply(s_acc);

    // Mask the tail of the key range and, when causal, keys past the diagonal (a window's
    // right edge); a left-bounded mask also keys before the last row's first key. Only tiles
    // that cross one of those pay for this.
    const int n0 = j * Bc;
    const bool tail = n0 + Bc > nk;
    const bool edge = n0 + Bc - 1 > mask.edge_key(m0);  // the first row's diagonal
    bool left_edge = false;
    if constexpr (Mask::kLeftBound) left_edge = n0 < mask.begin_edge(q_last);
    if (tail || edge || left_edge) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m0 + warp_row0 + mt * 16 + g + 8 * h;
          int limit = mask.key_limit(row);  // keys < limit
          int begin = 0;
          if constexpr (Mask::kLeftBound) {
            begin = row_begin[mt][h];  // ... and >= begin
            limit = row_limit[mt][h];
          }
#pragma unroll
          for (int nt = 0; nt < kST; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int key = n0 + nt * 8 + 2 * t + e;
              if constexpr (Mask::kLeftBound) {
                if (key < begin || key >= limit) s_acc[mt][nt][2 * h + e] = kNegInf;
              } else {
                if (key >= limit) s_acc[mt][nt][2 * h + e] = kNegInf;
              }
            }
        }
    }

    // Online softmax: new row max, rescale what was accumulated, exponentiate in place.
    fa::online_softmax(s_acc, o_acc, row_max, row_sum, scale_log2);

    cp_async_wait<2 * S - 2>();  // V(j) landed
    __syncthreads();             // ... for every thread; and all warps finished QK^T(j)
    load_k(j + S);

    // O += P V. The S accumulator layout of two adjacent n8 tiles is exactly the A operand
    // layout of one k16 step, so P goes from registers to the tensor cores directly.
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      uint32_t pa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        pa[mt][0] = Ops::pack(s_acc[mt][2 * kk][0], s_acc[mt][2 * kk][1]);
        pa[mt][1] = Ops::pack(s_acc[mt][2 * kk][2], s_acc[mt][2 * kk][3]);
        pa[mt][2] = Ops::pack(s_acc[mt][2 * kk + 1][0], s_acc[mt][2 * kk + 1][1]);
        pa[mt][3] = Ops::pack(s_acc[mt][2 * kk + 1][2], s_acc[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, sV_b + (j % S) * kTileBytes + kk * 16 * kRowBytes +
                                  2 * T::frag_chunk_offset(dp, v_term));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          Ops::mma(o_acc[mt][2 * dp], pa[mt], vb[0], vb[1]);
          Ops::mma(o_acc[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
  }

  // Epilogue: normalise, stage O through smem (the Q buffer) for 16-byte coalesced stores.
  cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float l = fa::quad_sum(row_sum[mt][h]);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int r = warp_row0 + mt * 16 + g + 8 * h;
#pragma unroll
      for (int dt = 0; dt < kOT; ++dt) {
        const uint32_t packed = Ops::pack(o_acc[mt][dt][2 * h] * inv, o_acc[mt][dt][2 * h + 1] * inv);
        *reinterpret_cast<uint32_t*>(sQ + T::offset(r, dt) + 2 * t) = packed;
      }
      if (gLse != nullptr && t == 0 && r < q_rows)
        gLse[r] = l > 0.f ? row_max[mt][h] * score.softmax_scale(p.softmax_scale) + logf(l)
                          : kNegInf;
    }
  __syncthreads();
  for (int idx = tid; idx < q_rows * T::kHeadChunks; idx += T::kThreads) {
    const int r = idx / T::kHeadChunks, c = idx % T::kHeadChunks;
    *reinterpret_cast<uint4*>(gO + r * p.o_row_stride + c * 8) =
        *reinterpret_cast<const uint4*>(sQ + T::offset(r, c));
  }
}

// Dense kernels take FaParams only; varlen kernels take FaVarlen after it.
// Variant kernels (a Local, Softcap or Sinks switch on) take FaVariant last.
template <class T>
__global__ void __launch_bounds__(T::kThreads) fwd_kernel(const FaParams p) {
  static_assert(!T::Varlen, "varlen kernels take FaVarlen: fwd_varlen_kernel");
  static_assert(!T::kVariant, "variant kernels take FaVariant: fwd_variant_kernel");
  fwd_body<T>(p, FaVarlen{}, FaVariant{});
}
template <class T>
__global__ void __launch_bounds__(T::kThreads) fwd_varlen_kernel(const FaParams p,
                                                                  const FaVarlen vl) {
  static_assert(T::Varlen, "dense kernels take FaParams only: fwd_kernel");
  static_assert(!T::kVariant, "variant kernels take FaVariant: fwd_varlen_variant_kernel");
  fwd_body<T>(p, vl, FaVariant{});
}
template <class T>
__global__ void __launch_bounds__(T::kThreads) fwd_variant_kernel(const FaParams p,
                                                                   const FaVariant var) {
  static_assert(!T::Varlen, "varlen kernels take FaVarlen: fwd_varlen_variant_kernel");
  static_assert(T::kVariant, "plain kernels take no FaVariant: fwd_kernel");
  fwd_body<T>(p, FaVarlen{}, var);
}
template <class T>
__global__ void __launch_bounds__(T::kThreads)
    fwd_varlen_variant_kernel(const FaParams p, const FaVarlen vl, const FaVariant var) {
  static_assert(T::Varlen, "dense kernels take no FaVarlen: fwd_variant_kernel");
  static_assert(T::kVariant, "plain kernels take no FaVariant: fwd_varlen_kernel");
  fwd_body<T>(p, vl, var);
}

#ifndef __CUDACC_RTC__  // NVRTC compiles device code only (codegen/nvrtc_job.py)
// Host-side launchers for programs that compile the template themselves (the exported header).
template <class T>
inline cudaError_t launch(const FaParams& p, cudaStream_t stream) {
  cudaError_t err = cudaFuncSetAttribute(fwd_kernel<T>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         T::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid((p.nq + T::Br - 1) / T::Br, p.q_heads, p.batch);
  fwd_kernel<T><<<grid, T::kThreads, T::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}
// p.nq is the longest query sequence, p.batch the number of sequences.
template <class T>
inline cudaError_t launch_varlen(const FaParams& p, const FaVarlen& vl, cudaStream_t stream) {
  cudaError_t err = cudaFuncSetAttribute(fwd_varlen_kernel<T>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         T::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid((p.nq + T::Br - 1) / T::Br, p.q_heads, p.batch);
  fwd_varlen_kernel<T><<<grid, T::kThreads, T::kSmemBytes, stream>>>(p, vl);
  return cudaGetLastError();
}
// The variant kernels' launchers: the same grid (a window shortens the key loop, not the grid).
template <class T>
inline cudaError_t launch_variant(const FaParams& p, const FaVariant& var, cudaStream_t stream) {
  cudaError_t err = cudaFuncSetAttribute(fwd_variant_kernel<T>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         T::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid((p.nq + T::Br - 1) / T::Br, p.q_heads, p.batch);
  fwd_variant_kernel<T><<<grid, T::kThreads, T::kSmemBytes, stream>>>(p, var);
  return cudaGetLastError();
}
template <class T>
inline cudaError_t launch_varlen_variant(const FaParams& p, const FaVarlen& vl,
                                         const FaVariant& var, cudaStream_t stream) {
  cudaError_t err = cudaFuncSetAttribute(fwd_varlen_variant_kernel<T>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         T::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid((p.nq + T::Br - 1) / T::Br, p.q_heads, p.batch);
  fwd_varlen_variant_kernel<T><<<grid, T::kThreads, T::kSmemBytes, stream>>>(p, vl, var);
  return cudaGetLastError();
}
#endif  // __CUDACC_RTC__

}  // namespace fa2

// One extern "C" kernel per config, named by the config, for loading from a cubin.
#define FA2_DEFINE_KERNEL(NAME, D, ELEM, CAUSAL, BR, BC, WARPS, STAGES, PAD, SWIZZLE)         \
  using NAME##_traits = fa2::Traits<D, ELEM, CAUSAL, BR, BC, WARPS, STAGES, PAD, SWIZZLE>;    \
  extern "C" __global__ void __launch_bounds__(NAME##_traits::kThreads)                      \
      NAME(const FaParams p) {                                                               \
    fa2::fwd_body<NAME##_traits>(p, FaVarlen{}, FaVariant{});                                 \
  }
#define FA2_DEFINE_VARLEN_KERNEL(NAME, D, ELEM, CAUSAL, BR, BC, WARPS, STAGES, PAD, SWIZZLE)  \
  using NAME##_traits =                                                                       \
      fa2::Traits<D, ELEM, CAUSAL, BR, BC, WARPS, STAGES, PAD, SWIZZLE, true>;                \
  extern "C" __global__ void __launch_bounds__(NAME##_traits::kThreads)                      \
      NAME(const FaParams p, const FaVarlen vl) {                                            \
    fa2::fwd_body<NAME##_traits>(p, vl, FaVariant{});                                         \
  }

// A variant config (a LOCAL, SOFTCAP or SINKS switch on): every Traits argument, switches last;
// the kernel takes FaVariant after FaParams (and FaVarlen when VARLEN is true). VARLEN's token
// (true / false) picks the argument list and the FaVarlen passed on.
#define FA2_PASTE_(A, B) A##B
#define FA2_PASTE(A, B) FA2_PASTE_(A, B)
#define FA2_VARIANT_ARGS_false const FaParams p, const FaVariant var
#define FA2_VARIANT_ARGS_true const FaParams p, const FaVarlen vl, const FaVariant var
#define FA2_VARIANT_VARLEN_false FaVarlen{}
#define FA2_VARIANT_VARLEN_true vl
#define FA2_DEFINE_VARIANT_KERNEL(NAME, D, ELEM, CAUSAL, BR, BC, WARPS, STAGES, PAD, SWIZZLE,  \
                                  VARLEN, LOCAL, SOFTCAP, SINKS)                               \
  using NAME##_traits = fa2::Traits<D, ELEM, CAUSAL, BR, BC, WARPS, STAGES, PAD, SWIZZLE,      \
                                    VARLEN, LOCAL, SOFTCAP, SINKS>;                             \
  static_assert(NAME##_traits::kVariant, "a variant kernel sets a variant switch");           \
  extern "C" __global__ void __launch_bounds__(NAME##_traits::kThreads)                      \
      NAME(FA2_PASTE(FA2_VARIANT_ARGS_, VARLEN)) {                                            \
    fa2::fwd_body<NAME##_traits>(p, FA2_PASTE(FA2_VARIANT_VARLEN_, VARLEN), var);             \
  }
