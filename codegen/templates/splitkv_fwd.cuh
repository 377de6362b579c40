// fa2tune: split-KV forward for calls with few query rows per KV head (decode), sm_80+.
//
// Decode (Nq = 1 or a few speculative tokens) gives a split-Q kernel one block per
// (batch, head): a handful of blocks on 132 SMs, each computing 63 dead rows of a 64-row tile.
// This template turns the problem around:
//
// * Rows: the query heads of one GQA group and their Nq rows are packed into one block's rows
//   (packed row r is query r / group of head kv_head * group + r % group), so each K/V tile is
//   read once per KV head, not once per query head. Tiles are 16, 32 or 64 rows.
// * Warps split the keys, not the rows: every warp holds the block's query rows and streams
//   its own K/V tiles (tile j of the block's range goes to warp j % Warps) through its own
//   cp.async ring of `Stages` buffers, synchronising with nothing but itself (__syncwarp).
//   At the end the warps' (max, sum, O) are merged through shared memory.
// * Blocks split the keys too: gridDim.y blocks share one (batch, KV head, row tile), each
//   taking a contiguous range of key tiles. Each writes its normalised O and LSE to a float32
//   workspace; the last block to finish (a per-tile counter, reset by that block so the
//   workspace can be reused by the next launch on the same stream) merges the partials with
//   their LSE weights into O and LSE. One launch, no separate combine kernel.
//
// Causal masking is bottom-right aligned (query i sees key j iff j <= i + nk - nq), as in
// fa2_fwd.cuh; rows that see no key get O = 0 and LSE = -inf.
//
// Head dims: any multiple of 8 up to 256. The tile's D is the head dim rounded up to a multiple
// of 32 (the swizzle permutes groups of 4 chunks), as in fa2_fwd.cuh. Chunks past the head dim
// are zero-filled on load where an mma reads them and never loaded past the last 16-column
// k-step; the mma loops stop at that k-step (D=40: 3 of the 64-wide tile's 4); O, the
// workspace partials and the merge cover the head dim's chunks only.
//
// Kernel arguments: FaParams, then float* ws_o ([partial rows][DHead]: the head dim, not the
// tile's), float* ws_lse, int* ws_count (sizes: see workspace_bytes below and
// docs/splitkv_kernel.md). Grid: (row tiles * kv_heads * batch, splits); row tiles =
// ceil(group * nq / Rows). Batch * heads lives in grid.x, so any batch up to the int32 limits
// launches.
//
// Attention variants (VariantTraits: Traits plus the Local, Softcap and Sinks switches; plain
// kernels keep Traits, their code, their arguments and the name of `last`, which carries
// fwd_body's signature): the kernel takes FaVariant after the workspace pointers. Local
// masks with fa::LocalMask; a row tile's key range is [n_block_min(first query row),
// n_block_max(last query row + 1)), and the splits divide that range, so a window reads only
// its keys and every split that has tiles does useful work. The host keeps sizing the grid
// and the workspace from nk (splits_for): splits past the range's tiles see no key and write
// the neutral partial (O 0, LSE -inf) that the merge skips. Softcap transforms S after the
// GEMM (fa::SoftcapScore). Sinks join the softmax's denominator once, where the result is
// final: in the block's own merge with one split, in the last block's merge of the splits
// otherwise; a row no split saw a key for gets O = 0 and LSE = its head's sink logit.
//
// KV caches (CacheTraits: the variant switches, any or none, plus the page size; kernels take
// FaVariant and FaKvCache after the workspace pointers): each sequence's key count is read
// from the device (FaKvCache::seqlens plus the keys this call appended), so one launch serves
// every step of a decode loop and a captured graph replays over growing lengths; FaParams' nk
// is the cache's capacity, which sizes the grid and the workspace, and the splits divide the
// sequence's own key tiles. A contiguous cache may map batch rows to cache rows (batch_idx);
// a paged cache reads key row j of sequence b from page block_table[b][j / Page], row
// j % Page, with FaParams' batch strides as the page strides. Everything else (masking
// bottom-right at the sequence's own length, the variants, the merge) is the body above.
#pragma once

#ifndef __CUDACC_RTC__  // NVRTC: the device built-ins need no header
#include <cuda_runtime.h>
#endif

#include <cstdint>

#include "fa_mask.cuh"     // mask and score policies
#include "fa_mma.cuh"      // mma.sync, ldmatrix, cp.async
#include "fa_params.cuh"   // FaParams
#include "fa_softmax.cuh"  // the online softmax
#include "kv_append.cuh"   // the cache kernels' append

namespace splitkv {

using fa::cp_async_16;
using fa::cp_async_commit;
using fa::cp_async_wait;
using fa::ElemOps;
using fa::fast_exp2;
using fa::ldmatrix_x4;
using fa::ldmatrix_x4_trans;
using fa::smem_u32;

template <int DHead_, typename Elem_, bool Causal_, int Rows_, int Bc_, int Warps_, int Stages_,
          int Splits_>
struct Traits {
  using Elem = Elem_;
  static constexpr int DHead = DHead_;               // the head dim of the tensors
  static constexpr int D = (DHead_ + 31) / 32 * 32;  // the tile's: rounded up to 32
  static constexpr bool Causal = Causal_;
  static constexpr int Rows = Rows_;
  static constexpr int Bc = Bc_;
  static constexpr int Warps = Warps_;
  static constexpr int Stages = Stages_;
  static constexpr int Splits = Splits_;  // most blocks per row tile; the host may use fewer
  static constexpr bool Local = false;    // VariantTraits sets these
  static constexpr bool Softcap = false;
  static constexpr bool Sinks = false;
  static constexpr bool kVariant = false;
  static constexpr bool kCache = false;  // CacheTraits sets these
  static constexpr int kPage = 0;
  static constexpr bool kCapSplit = false;

  static constexpr int kThreads = 32 * Warps;
  static constexpr int kMTiles = Rows / 16;
  static constexpr int kSTiles = Bc / 8;
  static constexpr int kOTiles = D / 8;
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static constexpr int kHeadChunks = DHead / 8;         // ... of them holding the tensors' data
  static constexpr int kKSteps = (DHead + 15) / 16;     // 16-column k-steps the mmas use
  static constexpr int kUsedChunks = 2 * kKSteps;       // chunks those read (zero past DHead)
  static constexpr int kUsedOTiles = 2 * kKSteps;       // 8-column O tiles they write
  static constexpr int kTileElems = Bc * D;
  static constexpr int kQBytes = Rows * D * 2;
  static constexpr int kKVBytes = Warps * Stages * 2 * kTileElems * 2;
  static constexpr int kMergeBytes = Warps * Rows * D * 4;  // each warp's O, float32
  static constexpr int kAreaBytes = kKVBytes > kMergeBytes ? kKVBytes : kMergeBytes;
  static constexpr int kStatBytes = (2 * Warps + 2) * Rows * 4;
  static constexpr int kSmemBytes = kQBytes + kAreaBytes + kStatBytes;
  static constexpr bool kQInRegs = kMTiles == 1 && D <= 128;  // else ldmatrix per k-step

  static_assert(DHead % 8 == 0 && DHead >= 8 && DHead <= 256,
                "head dim must be 8..256, multiple of 8");
  static_assert(Rows == 16 || Rows == 32 || Rows == 64, "16, 32 or 64 packed rows");
  static_assert(Rows * D <= 4096, "the O accumulator must fit in registers");
  static_assert(Bc % 16 == 0 && Bc >= 16 && Bc <= 64, "Bc must be 16, 32, 48 or 64");
  static_assert(Stages >= 1 && Stages <= 4, "1..4 K/V stages per warp");
  static_assert(Warps >= 1 && Warps <= 8, "1..8 warps");
  static_assert(Splits >= 1 && Splits <= 128, "1..128 splits");
  static_assert(kAreaBytes >= Rows * Splits * 4, "merge weights reuse the merge area");

  // Element offset of chunk c of row r: the XOR swizzle of fa2_fwd.cuh, so the 8 rows an
  // ldmatrix phase reads sit in 8 different 16-byte bank groups.
  static constexpr int kSwizzleMask = kChunks % 8 == 0 ? 7 : 3;  // chunk bits it permutes
  static __device__ __forceinline__ int swizzle_term(int r) {
    return kChunks % 8 == 0 ? (r & 7) : ((r >> 1) & 3);
  }
  static __device__ __forceinline__ int offset(int r, int c) {
    return r * D + (c ^ swizzle_term(r)) * 8;
  }
};

// A variant kernel's traits: a plain tile's plus the variant switches (a type of its own, not
// more Traits parameters: the plain kernels' `last` is named by fwd_body<Traits<...>>).
template <int DHead_, typename Elem_, bool Causal_, int Rows_, int Bc_, int Warps_, int Stages_,
          int Splits_, bool Local_ = false, bool Softcap_ = false, bool Sinks_ = false>
struct VariantTraits : Traits<DHead_, Elem_, Causal_, Rows_, Bc_, Warps_, Stages_, Splits_> {
  using Plain = Traits<DHead_, Elem_, Causal_, Rows_, Bc_, Warps_, Stages_, Splits_>;
  static constexpr bool Local = Local_;      // window / chunk mask (fa::LocalMask)
  static constexpr bool Softcap = Softcap_;  // tanh logit cap (fa::SoftcapScore)
  static constexpr bool Sinks = Sinks_;      // per-head sink logits in the denominator
  static constexpr bool kVariant = Local || Softcap || Sinks;
  static_assert(kVariant, "a variant kernel sets a variant switch (plain ones use Traits)");
};

// A KV-cache kernel's traits: a variant kernel's switches (any of them, or none) plus the cache
// layout. The kernel reads each sequence's length from FaKvCache (device memory), and with
// Page > 0 reads K and V through its block table, pages of Page keys (a power of two): where a
// page holds whole key tiles (Page >= Bc) one table entry per tile, else one per key row.
// CapSplit: the splits divide the cache's capacity, not each sequence's length (see fwd_main),
// so a short sequence runs on its first splits and the rest exit at once.
template <int DHead_, typename Elem_, bool Causal_, int Rows_, int Bc_, int Warps_, int Stages_,
          int Splits_, bool Local_, bool Softcap_, bool Sinks_, int Page_, bool CapSplit_>
struct CacheTraits : Traits<DHead_, Elem_, Causal_, Rows_, Bc_, Warps_, Stages_, Splits_> {
  static constexpr bool Local = Local_;
  static constexpr bool Softcap = Softcap_;
  static constexpr bool Sinks = Sinks_;
  static constexpr bool kVariant = Local || Softcap || Sinks;
  static constexpr bool kCache = true;
  static constexpr int kPage = Page_;  // 0: a contiguous cache
  static constexpr bool kCapSplit = CapSplit_;
  static_assert(!(CapSplit_ && Local_), "a window's key range keeps its own division");
  static_assert(Page_ >= 0 && (Page_ & (Page_ - 1)) == 0, "the page size is a power of two");
};

// Byte offsets of the chunks a lane's ldmatrix reads, for fragment rows row0 + 16 * i (same
// swizzle term) and chunks 2 * ks + lane_chunk. The chunk splits into a high part that the
// swizzle leaves alone (a compile-time immediate once ks is unrolled) and a low part, of which
// only kVariants values occur per lane: kept in that many registers, instead of one address
// per (i, ks) pair hoisted out of the key loop.
template <class T>
struct FragOffsets {
  static constexpr int kVariants = (T::kSwizzleMask + 1) / 2;
  int low[kVariants];
  __device__ __forceinline__ FragOffsets(int row0, int lane_chunk) {
    const int term = T::swizzle_term(row0);
#pragma unroll
    for (int j = 0; j < kVariants; ++j) low[j] = (((2 * j) | lane_chunk) ^ term) * 16;
  }
  // Bytes from the start of the fragment row to chunk 2 * ks + lane_chunk.
  __device__ __forceinline__ int at(int ks) const {
    return (2 * ks & ~T::kSwizzleMask) * 16 + low[ks % kVariants];
  }
};

#ifndef __CUDACC_RTC__  // host helpers: NVRTC compiles device code only
// Bytes of workspace a launch needs: partial O (DHead floats per row: the head dim, not the
// tile's) and LSE per (row tile, split) and one counter per row tile. Zero with one split (the
// block writes O itself). core/splitkv_config.py's workspace_bytes is the same formula.
template <class T>
inline size_t workspace_bytes(const FaParams& p, int splits) {
  if (splits <= 1) return 0;
  const int64_t tiles = static_cast<int64_t>((p.q_heads / p.kv_heads) * p.nq + T::Rows - 1) /
                        T::Rows * p.kv_heads * p.batch;
  const int64_t partial = tiles * splits * T::Rows;
  return static_cast<size_t>(partial * (T::DHead + 1) * 4 + tiles * 4);
}

// Splits a launch uses: the config's, but never more than there are key tiles.
template <class T>
inline int splits_for(const FaParams& p) {
  const int tiles = (p.nk + T::Bc - 1) / T::Bc;
  return tiles < T::Splits ? (tiles > 0 ? tiles : 1) : T::Splits;
}
#endif  // __CUDACC_RTC__

// The kernel body; `last` is the caller's __shared__ flag (see fwd_body) and `var` is read
// only where a variant switch is on. `split_keys` is read only by a capacity-split cache
// kernel (T::kCapSplit): the keys its splits divide, the cache's capacity.
template <class T>
__device__ __forceinline__ void fwd_main(const FaParams& p, float* __restrict__ ws_o,
                                         float* __restrict__ ws_lse, int* __restrict__ ws_count,
                                         const FaVariant& var, const FaKvCache& kc,
                                         int& last, int split_keys) {
  using Elem = typename T::Elem;
  using Ops = ElemOps<Elem>;
  using Mask = fa::VariantMask<T::Causal, T::Local>;
  using Score = fa::ScoreFor<T::Softcap>;
  constexpr int Rows = T::Rows, Bc = T::Bc, D = T::D, S = T::Stages, W = T::Warps;
  constexpr int kMT = T::kMTiles, kST = T::kSTiles, kCh = T::kChunks;
  constexpr int kHCh = T::kHeadChunks, kUCh = T::kUsedChunks, kKS = T::kKSteps;
  constexpr int kUOT = T::kUsedOTiles;  // O tiles past these stay zero and are never read
  constexpr int DH = T::DHead;
  constexpr float kNegInf = fa::kNegInf;
  constexpr float kLog2e = fa::kLog2e;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Elem* sQ = reinterpret_cast<Elem*>(smem_raw);
  Elem* sKV = reinterpret_cast<Elem*>(smem_raw + T::kQBytes);         // [W][S][K|V][Bc][D]
  float* sMerge = reinterpret_cast<float*>(smem_raw + T::kQBytes);    // [W][Rows][D] after
  float* sMax = reinterpret_cast<float*>(smem_raw + T::kQBytes + T::kAreaBytes);  // [W][Rows]
  float* sSum = sMax + W * Rows;                                      // [W][Rows]
  float* sRowMax = sSum + W * Rows;                                   // [Rows], merged
  float* sRowSum = sRowMax + Rows;                                    // [Rows], merged

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  const int group = p.q_heads / p.kv_heads;
  const int packed = group * p.nq;  // packed rows of one (batch, KV head)
  const int m_tiles = (packed + Rows - 1) / Rows;
  const int m_tile = blockIdx.x % m_tiles;
  const int kv_head = (blockIdx.x / m_tiles) % p.kv_heads;
  const int batch = blockIdx.x / m_tiles / p.kv_heads;
  const int split = blockIdx.y;
  const int splits = gridDim.y;
  const int r0 = m_tile * Rows;
  const int valid_rows = min(Rows, packed - r0);
  const Mask mask(p.nq, p.nk, var.window_left, var.window_right, var.chunk);
  const int q_last = (r0 + valid_rows - 1) / group;  // the block's last query row
  int t_begin, t_end;  // this split's key tiles
  if constexpr (Mask::kLeftBound) {
    // Key tiles [n_begin, n_end) of the tile's rows, divided among the splits.
    const int n_begin = mask.n_block_min(r0 / group, Bc);
    const int n_range = max(mask.n_block_max(q_last + 1, Bc) - n_begin, 0);
    const int per_split = (n_range + splits - 1) / splits;
    t_begin = n_begin + min(split * per_split, n_range);
    t_end = min(t_begin + per_split, n_begin + n_range);
  } else {
    // Key tiles [0, n_tiles): the keys the tile's last query row sees (packed row r holds
    // query row r / group), the most any of its rows sees: the mask policy's key_limit of
    // that row, spelled with this association so that the kernels' code stays the same
    // (bench/ptx_identity.py).
    int key_end = p.nk;
    if constexpr (Mask::kCausal) key_end = min(p.nk, (r0 + valid_rows - 1) / group + mask.diag + 1);
    const int n_tiles = fa::key_tiles(key_end, Bc);
    // Split s takes tiles [s * per_split, ...) of the sequence's. A capacity-split kernel
    // sizes the share from the capacity (the grid's splits cover it), so a sequence of a
    // tenth of it runs on a tenth of the splits and the others see no key: in a batch of
    // mixed lengths the short sequences take few blocks and the long ones keep every split.
    const int per_split = T::kCapSplit ? (fa::key_tiles(split_keys, Bc) + splits - 1) / splits
                                       : (n_tiles + splits - 1) / splits;
    t_begin = min(split * per_split, n_tiles);
    t_end = min(t_begin + per_split, n_tiles);
  }
  const int my_tiles = t_end - t_begin > warp ? (t_end - t_begin - warp + W - 1) / W : 0;

  // Q rows are gathered from `group` heads; rows past the end, and chunks past the head dim
  // that an mma reads, are zero-filled.
  const Elem* q_base = static_cast<const Elem*>(p.q) + batch * p.q_batch_stride;
  for (int idx = tid; idx < Rows * kUCh; idx += T::kThreads) {
    const int r = idx / kUCh, c = idx % kUCh;
    const int row = r0 + r;
    const bool valid = r < valid_rows && (kHCh == kUCh || c < kHCh);
    const Elem* src = valid ? q_base + (kv_head * group + row % group) * p.q_head_stride +
                                  static_cast<int64_t>(row / group) * p.q_row_stride + c * 8
                            : q_base;
    cp_async_16(smem_u32(sQ + T::offset(r, c)), src, valid ? 16 : 0);
  }
  cp_async_commit();

  const Elem* gK =
      static_cast<const Elem*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
  const Elem* gV =
      static_cast<const Elem*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
  // A paged cache: the batch strides are page strides, and the pages come from the table.
  [[maybe_unused]] const int32_t* page_of = nullptr;
  if constexpr (T::kPage > 0) {
    gK = static_cast<const Elem*>(p.k) + kv_head * p.k_head_stride;
    gV = static_cast<const Elem*>(p.v) + kv_head * p.v_head_stride;
    page_of = kc.block_table;  // this sequence's row (fwd_body's cache overload moved it)
  }
  Elem* sK_warp = sKV + warp * S * 2 * T::kTileElems;

  // This warp's i-th tile: K and V rows into ring slot i % S, keys past nk and chunks past the
  // head dim zero-filled, chunks no mma reads (kUsedChunks and on) left alone. A lane copies
  // chunk column `c` of rows r_lane, r_lane + kRowStep, ...: its global addresses advance by
  // a fixed stride and its swizzled smem chunk takes few values (see FragOffsets).
  constexpr int kRowStep = 32 % kCh == 0 ? 32 / kCh : 0;  // 0: chunks do not tile 32 lanes
  const int c_lane = lane % kCh;
  const int r_lane = lane / kCh;
  // Rows r_lane + it * kRowStep: r_lane sits below kRowStep's bit, so the swizzle term of the
  // row is r_lane's XOR it * kRowStep's, the latter a compile-time constant.
  const int c_swz = c_lane ^ T::swizzle_term(r_lane);
  const bool c_data = kHCh == kCh || c_lane < kHCh;   // the lane's chunk holds tensor data
  const bool c_used = kUCh == kCh || c_lane < kUCh;   // an mma reads the lane's chunk
  const uint32_t sKV_warp = smem_u32(sK_warp);
  auto load = [&](int i) {
    if (i < my_tiles) {
      const int key0 = (t_begin + warp + i * W) * Bc;
      const uint32_t sK = sKV_warp + (i % S) * 2 * T::kTileElems * 2;
      const uint32_t sV = sK + T::kTileElems * 2;
      const int rows_left = p.nk - key0;
      // Where the tile's rows start: key0 of K and V, or in a paged cache whose pages hold
      // whole tiles (Page >= Bc, tiles start at multiples of Bc) row key0 % Page of the
      // tile's page, looked up once.
      const Elem* k_rows = gK;
      const Elem* v_rows = gV;
      int row0 = key0;
      if constexpr (T::kPage >= Bc) {
        const int64_t page = page_of[key0 / T::kPage];
        k_rows = gK + page * p.k_batch_stride;
        v_rows = gV + page * p.v_batch_stride;
        row0 = key0 % T::kPage;
      }
      if constexpr (T::kPage > 0 && T::kPage < Bc && kRowStep > 0 && T::kPage >= kRowStep) {
        // Pages smaller than a tile but holding whole steps of a lane's rows: the tile's
        // Bc / Page table entries are read once, and row r_lane + it * kRowStep of the tile
        // lies in its page (it * kRowStep) / Page, a compile-time index (r_lane < kRowStep).
        // Entries past nk are not read (the table may end there).
        constexpr int P = T::kPage, kPages = Bc / P;
        int64_t page[kPages];
#pragma unroll
        for (int j = 0; j < kPages; ++j)
          page[j] = j * P < rows_left ? static_cast<int64_t>(page_of[key0 / P + j]) : 0;
        if (c_used) {
          // By 4, as the per-row path below: fully unrolled, the copies' addresses of the
          // whole tile are held at once (d=128, Page=16: 255 registers against 166).
#pragma unroll 4
          for (int it = 0; it < Bc / kRowStep; ++it) {
            const int r = r_lane + it * kRowStep;
            const int in_page = (it * kRowStep) % P + r_lane;
            const int64_t at = page[(it * kRowStep) / P];
            const bool valid = c_data && r < rows_left;
            const Elem* k_src = gK + at * p.k_batch_stride + in_page * p.k_row_stride + c_lane * 8;
            const Elem* v_src = gV + at * p.v_batch_stride + in_page * p.v_row_stride + c_lane * 8;
            const uint32_t dst = (r * D + (c_swz ^ T::swizzle_term(it * kRowStep)) * 8) * 2;
            cp_async_16(sK + dst, valid ? k_src : gK, valid ? 16 : 0);
            cp_async_16(sV + dst, valid ? v_src : gV, valid ? 16 : 0);
          }
        }
      } else if constexpr (T::kPage > 0 && T::kPage < Bc) {
        // Pages smaller than a lane's row step (or D whose chunks do not tile a warp): key
        // row key0 + r is row (key0 + r) % Page of page page_of[(key0 + r) / Page], looked
        // up per row. Rows past nk read nothing (and look up nothing).
        constexpr int P = T::kPage;
        // A lane's rows and chunk as in the contiguous paths below (kRowStep > 0: one chunk
        // column, rows r_lane + it * kRowStep; else the flat index), one lookup per row.
        // Unrolled by 4, not fully: a full unroll hoists every row's table load ahead of
        // the copies and holds them all (d=128, Bc=32, Page=16: 238 registers, against 168).
        constexpr int kIters = kRowStep > 0 ? Bc / kRowStep : Bc * kCh / 32;
#pragma unroll 4
        for (int it = 0; it < kIters; ++it) {
          const int idx = it * 32 + lane;
          const int r = kRowStep > 0 ? r_lane + it * kRowStep : idx / kCh;
          const int c = kRowStep > 0 ? c_lane : idx % kCh;
          if (kUCh == kCh || c < kUCh) {
            const bool valid = r < rows_left && (kHCh == kCh || c < kHCh);
            const Elem* k_src = gK;
            const Elem* v_src = gV;
            if (valid) {
              const int key = key0 + r;
              const int64_t page = page_of[key / P];
              const int in_page = key % P;
              k_src = gK + page * p.k_batch_stride + in_page * p.k_row_stride + c * 8;
              v_src = gV + page * p.v_batch_stride + in_page * p.v_row_stride + c * 8;
            }
            const uint32_t dst = T::offset(r, c) * 2;
            cp_async_16(sK + dst, k_src, valid ? 16 : 0);
            cp_async_16(sV + dst, v_src, valid ? 16 : 0);
          }
        }
      } else if constexpr (kRowStep > 0) {
        if (c_used) {  // the same chunk column on every row: a lane's whole loop or nothing
          const Elem* k_src =
              k_rows + (static_cast<int64_t>(row0) + r_lane) * p.k_row_stride + c_lane * 8;
          const Elem* v_src =
              v_rows + (static_cast<int64_t>(row0) + r_lane) * p.v_row_stride + c_lane * 8;
#pragma unroll
          for (int it = 0; it < Bc / kRowStep; ++it) {
            const int r = r_lane + it * kRowStep;
            const bool valid = c_data && r < rows_left;
            const uint32_t dst = (r * D + (c_swz ^ T::swizzle_term(it * kRowStep)) * 8) * 2;
            cp_async_16(sK + dst, valid ? k_src : gK, valid ? 16 : 0);
            cp_async_16(sV + dst, valid ? v_src : gV, valid ? 16 : 0);
            k_src += kRowStep * p.k_row_stride;
            v_src += kRowStep * p.v_row_stride;
          }
        }
      } else {
        const Elem* k_tile = k_rows + static_cast<int64_t>(row0) * p.k_row_stride;
        const Elem* v_tile = v_rows + static_cast<int64_t>(row0) * p.v_row_stride;
#pragma unroll
        for (int it = 0; it < Bc * kCh / 32; ++it) {
          const int idx = it * 32 + lane;
          const int r = idx / kCh, c = idx % kCh;
          if (kUCh == kCh || c < kUCh) {
            const bool valid = r < rows_left && (kHCh == kCh || c < kHCh);
            const uint32_t dst = T::offset(r, c) * 2;
            cp_async_16(sK + dst, valid ? k_tile + r * p.k_row_stride + c * 8 : gK,
                        valid ? 16 : 0);
            cp_async_16(sV + dst, valid ? v_tile + r * p.v_row_stride + c * 8 : gV,
                        valid ? 16 : 0);
          }
        }
      }
    }
    cp_async_commit();  // empty groups keep the wait count constant
  };

  for (int s = 0; s < S - 1; ++s) load(s);
  cp_async_wait<(S > 1 ? S - 1 : 0)>();  // the Q group (the oldest) has landed
  __syncthreads();

  float o_acc[kMT][kUOT][4];
  float row_max[kMT][2];
  float row_sum[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kUOT; ++dt)
#pragma unroll
      for (int i = 0; i < 4; ++i) o_acc[mt][dt][i] = 0.f;
    row_max[mt][0] = row_max[mt][1] = kNegInf;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }

  const Score score(p.softmax_scale, var.softcap);
  const float scale_log2 = score.softmax_scale(p.softmax_scale) * kLog2e;
  const int a_row = (lane % 8) + 8 * ((lane / 8) % 2);
  const int k_row = (lane % 8) + 8 * (lane / 16);
  const int v_row = (lane % 8) + 8 * ((lane / 8) % 2);

  constexpr int kRowBytes = D * 2;
  const FragOffsets<T> a_off(a_row, lane / 16), k_off(k_row, (lane / 8) % 2);
  const FragOffsets<T> v_off(v_row, lane / 16);
  const uint32_t sQ_a = smem_u32(sQ) + a_row * kRowBytes;
  const uint32_t sK_b = sKV_warp + k_row * kRowBytes;
  const uint32_t sV_b = sKV_warp + T::kTileElems * 2 + v_row * kRowBytes;

  uint32_t q_frag[T::kQInRegs ? kKS : 1][4];
  if constexpr (T::kQInRegs) {
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) ldmatrix_x4(q_frag[ks], sQ_a + a_off.at(ks));
  }

  const int q_first = r0 / group;  // the block's first query row (causal diagonal test)
  for (int i = 0; i < my_tiles; ++i) {
    load(i + S - 1);
    cp_async_wait<S - 1>();
    __syncwarp();
    const uint32_t slot = (i % S) * 2 * T::kTileElems * 2;
    const int key0 = (t_begin + warp + i * W) * Bc;

    float s_acc[kMT][kST][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kST; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s_acc[mt][nt][e] = 0.f;

#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
      uint32_t qa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if constexpr (T::kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) qa[mt][e] = q_frag[ks][e];
        } else {
          ldmatrix_x4(qa[mt], sQ_a + mt * 16 * kRowBytes + a_off.at(ks));
        }
      }
#pragma unroll
      for (int np = 0; np < kST / 2; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, sK_b + slot + np * 16 * kRowBytes + k_off.at(ks));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          Ops::mma(s_acc[mt][2 * np], qa[mt], kb[0], kb[1]);
          Ops::mma(s_acc[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }

    score.apply(s_acc);

    // Mask keys past nk and, when causal, past each row's diagonal (a window's right edge);
    // a left-bounded mask also keys before a row's first key.
    const bool tail = key0 + Bc > p.nk;
    const bool edge = key0 + Bc - 1 > mask.edge_key(q_first);
    bool left_edge = false;
    if constexpr (Mask::kLeftBound) left_edge = key0 < mask.begin_edge(q_last);
    if (edge || tail || left_edge) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int q_row = (r0 + mt * 16 + g + 8 * h) / group;
          if constexpr (Mask::kLeftBound) {
            const int begin = mask.key_begin(q_row), limit = mask.key_limit(q_row);
#pragma unroll
            for (int nt = 0; nt < kST; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int key = key0 + nt * 8 + 2 * t + e;
                if (key < begin || key >= limit) s_acc[mt][nt][2 * h + e] = kNegInf;
              }
          } else {
            // FaParams' lengths read here, where the kernel always read them (same code).
            const int limit = Mask::of_diag(p.nk, mask.diag).key_limit(q_row);
#pragma unroll
            for (int nt = 0; nt < kST; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e)
                if (key0 + nt * 8 + 2 * t + e >= limit) s_acc[mt][nt][2 * h + e] = kNegInf;
          }
        }
    }

    // Online softmax, per warp (each warp keeps its own running max and sum).
    fa::online_softmax(s_acc, o_acc, row_max, row_sum, scale_log2);

    // O += P V, P straight from the S accumulators (their layout is the A operand's).
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
      for (int dp = 0; dp < kKS; ++dp) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, sV_b + slot + kk * 16 * kRowBytes + v_off.at(dp));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          Ops::mma(o_acc[mt][2 * dp], pa[mt], vb[0], vb[1]);
          Ops::mma(o_acc[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
    __syncwarp();  // every lane is done with slot i % S before load(i + S) refills it
  }

  // ---- Merge the warps: block row max, each warp's O rescaled to it, then summed.
  cp_async_wait<0>();
  __syncthreads();  // all warps are out of their K/V rings: the merge area may alias them
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float l = fa::quad_sum(row_sum[mt][h]);
      row_sum[mt][h] = l;
      if (t == 0) {
        const int r = mt * 16 + g + 8 * h;
        sMax[warp * Rows + r] = row_max[mt][h];
        sSum[warp * Rows + r] = l;
      }
    }
  __syncthreads();
  // Packed row r's sink logit (natural log), or -inf (no sinks, or none given).
  auto sink_of = [&](int r) {
    float sink = kNegInf;
    if constexpr (T::Sinks) {
      if (var.sinks != nullptr) sink = var.sinks[kv_head * group + (r0 + r) % group];
    }
    return sink;
  };
  for (int r = tid; r < Rows; r += T::kThreads) {  // merged max and sum of row r
    float mx = kNegInf;
    for (int w = 0; w < W; ++w) mx = fmaxf(mx, sMax[w * Rows + r]);
    // With one split this merge is final: the sink joins it as one more term.
    float sink_max = kNegInf;
    if constexpr (T::Sinks) {
      if (splits == 1) sink_max = fa::sink_row_max(sink_of(r), score.softmax_scale(p.softmax_scale));
      mx = fmaxf(mx, sink_max);
    }
    float l = 0.f;
    if (mx != kNegInf)
      for (int w = 0; w < W; ++w) {
        const float m_w = sMax[w * Rows + r];
        if (m_w != kNegInf) l += sSum[w * Rows + r] * fast_exp2((m_w - mx) * scale_log2);
      }
    if constexpr (T::Sinks) {
      if (sink_max != kNegInf) l += fast_exp2((sink_max - mx) * scale_log2);
    }
    sRowMax[r] = mx;
    sRowSum[r] = l;
  }
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = mt * 16 + g + 8 * h;
      const float mx = sRowMax[r];
      const float l = sRowSum[r];
      // This warp's share, already divided by the merged sum: sMerge holds normalised O.
      const float w = (row_max[mt][h] == kNegInf || l == 0.f)
                          ? 0.f
                          : fast_exp2((row_max[mt][h] - mx) * scale_log2) / l;
      float* dst = sMerge + (warp * Rows + r) * D + 2 * t;
#pragma unroll
      for (int dt = 0; dt < kUOT; ++dt)
        *reinterpret_cast<float2*>(dst + dt * 8) =
            make_float2(o_acc[mt][dt][2 * h] * w, o_acc[mt][dt][2 * h + 1] * w);
    }
  __syncthreads();

  // Sums over the warps of 8 consecutive columns of one row, into `out`.
  auto merged_chunk = [&](int r, int c, float (&out)[8]) {
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = 0.f;
    for (int w = 0; w < W; ++w) {
      const float4* src = reinterpret_cast<const float4*>(sMerge + (w * Rows + r) * D + c * 8);
      const float4 a = src[0], b = src[1];
      out[0] += a.x, out[1] += a.y, out[2] += a.z, out[3] += a.w;
      out[4] += b.x, out[5] += b.y, out[6] += b.z, out[7] += b.w;
    }
  };
  auto row_lse = [&](int r) {
    return sRowSum[r] > 0.f ? sRowMax[r] * score.softmax_scale(p.softmax_scale) + logf(sRowSum[r])
                            : kNegInf;
  };
  Elem* o_base = static_cast<Elem*>(p.o) + batch * p.o_batch_stride;
  auto o_row = [&](int r) {  // packed row r of this tile -> its O row
    const int row = r0 + r;
    return o_base + (kv_head * group + row % group) * p.o_head_stride +
           static_cast<int64_t>(row / group) * p.o_row_stride;
  };
  auto lse_at = [&](int r) -> float* {
    const int row = r0 + r;
    return p.lse + (static_cast<int64_t>(batch) * p.q_heads + kv_head * group + row % group) *
                       p.nq + row / group;
  };
  auto store_chunk = [&](int r, int c, const float (&v)[8]) {
    uint4 packed_out;
    packed_out.x = Ops::pack(v[0], v[1]);
    packed_out.y = Ops::pack(v[2], v[3]);
    packed_out.z = Ops::pack(v[4], v[5]);
    packed_out.w = Ops::pack(v[6], v[7]);
    *reinterpret_cast<uint4*>(o_row(r) + c * 8) = packed_out;
  };

  if (splits == 1) {
    for (int idx = tid; idx < valid_rows * kHCh; idx += T::kThreads) {
      float v[8];
      merged_chunk(idx / kHCh, idx % kHCh, v);
      store_chunk(idx / kHCh, idx % kHCh, v);
    }
    if (p.lse != nullptr)
      for (int r = tid; r < valid_rows; r += T::kThreads) *lse_at(r) = row_lse(r);
    return;
  }

  // ---- Several splits: publish this block's partial, the last block merges them all.
  const int64_t part = (static_cast<int64_t>(blockIdx.x) * splits + split) * Rows;
  for (int idx = tid; idx < valid_rows * kHCh; idx += T::kThreads) {
    float v[8];
    merged_chunk(idx / kHCh, idx % kHCh, v);
    float4* dst = reinterpret_cast<float4*>(ws_o + (part + idx / kHCh) * DH + (idx % kHCh) * 8);
    dst[0] = make_float4(v[0], v[1], v[2], v[3]);
    dst[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
  for (int r = tid; r < valid_rows; r += T::kThreads) ws_lse[part + r] = row_lse(r);
  __threadfence();  // the partial is visible device-wide before the counter says so
  __syncthreads();
  if (tid == 0) last = atomicAdd(ws_count + blockIdx.x, 1) == splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // and this block sees every other block's partial

  // Merge weights exp(lse_s - lse) per (row, split), in the (now free) merge area.
  float* sWeight = sMerge;  // [Rows][splits]
  const int64_t part0 = static_cast<int64_t>(blockIdx.x) * splits * Rows;
  for (int r = tid; r < valid_rows; r += T::kThreads) {
    float mx = kNegInf;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, __ldcg(ws_lse + part0 + s * Rows + r));
    float sink = kNegInf;  // the sink joins the final merge (the partials are without it)
    if constexpr (T::Sinks) {
      sink = sink_of(r);
      mx = fmaxf(mx, sink);
    }
    float sum = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float lse_s = __ldcg(ws_lse + part0 + s * Rows + r);
      const float w = mx == kNegInf || lse_s == kNegInf ? 0.f : __expf(lse_s - mx);
      sWeight[r * splits + s] = w;
      sum += w;
    }
    if constexpr (T::Sinks) {
      if (sink != kNegInf) sum += __expf(sink - mx);
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int s = 0; s < splits; ++s) sWeight[r * splits + s] *= inv;
    if (p.lse != nullptr) *lse_at(r) = sum > 0.f ? mx + logf(sum) : kNegInf;
  }
  __syncthreads();
  for (int idx = tid; idx < valid_rows * kHCh; idx += T::kThreads) {
    const int r = idx / kHCh, c = idx % kHCh;
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float w = sWeight[r * splits + s];
      if (w == 0.f) continue;  // also skips partials of splits that saw no key
      const float4* src =
          reinterpret_cast<const float4*>(ws_o + (part0 + s * Rows + r) * DH + c * 8);
      const float4 a = __ldcg(src), b = __ldcg(src + 1);
      v[0] += w * a.x, v[1] += w * a.y, v[2] += w * a.z, v[3] += w * a.w;
      v[4] += w * b.x, v[5] += w * b.y, v[6] += w * b.z, v[7] += w * b.w;
    }
    store_chunk(r, c, v);
  }
  if (tid == 0) ws_count[blockIdx.x] = 0;  // ready for the next launch on this stream
}

// The plain kernels' body: its signature and T (Traits) name the block's `last` flag in the
// PTX, so they stay what they were; a variant kernel's takes FaVariant too.
template <class T>
__device__ __forceinline__ void fwd_body(const FaParams& p, float* __restrict__ ws_o,
                                         float* __restrict__ ws_lse, int* __restrict__ ws_count) {
  static_assert(!T::kVariant && !T::kCache, "variant kernels take FaVariant");
  __shared__ int last;
  fwd_main<T>(p, ws_o, ws_lse, ws_count, FaVariant{}, FaKvCache{}, last, p.nk);
}
template <class T>
__device__ __forceinline__ void fwd_body(const FaParams& p, float* __restrict__ ws_o,
                                         float* __restrict__ ws_lse, int* __restrict__ ws_count,
                                         const FaVariant& var) {
  static_assert(T::kVariant && !T::kCache, "plain kernels take no FaVariant");
  __shared__ int last;
  fwd_main<T>(p, ws_o, ws_lse, ws_count, var, FaKvCache{}, last, p.nk);
}
// A cache kernel's: the sequence's length read from the device (clamped to the capacity nk)
// and its cache row (a contiguous cache) or block-table row (a paged one); the body then
// runs on that length, reading kc.block_table as the sequence's own row of pages. A
// left-padded contiguous cache starts the sequence at key kc.leftpad[b]: K and V move there
// and the length shrinks by it, so masks and the split partition follow the keys it has.
template <class T>
__device__ __forceinline__ void fwd_body(const FaParams& p, float* __restrict__ ws_o,
                                         float* __restrict__ ws_lse, int* __restrict__ ws_count,
                                         const FaVariant& var, const FaKvCache& kc) {
  static_assert(T::kCache, "only cache kernels take FaKvCache");
  using Elem = typename T::Elem;
  __shared__ int last;
  const int m_tiles = ((p.q_heads / p.kv_heads) * p.nq + T::Rows - 1) / T::Rows;
  const int batch = blockIdx.x / m_tiles / p.kv_heads;
  FaParams pc = p;
  const int length = min(kc.seqlens[batch] + kc.added, p.nk);
  pc.nk = max(0, length);
  FaKvCache kb = kc;
  const int row = kc.batch_idx != nullptr ? kc.batch_idx[batch] : batch;
  if constexpr (T::kPage == 0) {  // batch row b reads cache row batch_idx[b]
    const int first = kc.leftpad != nullptr ? min(max(kc.leftpad[batch], 0), pc.nk) : 0;
    pc.nk = max(0, length - first);
    const int64_t shift = row - batch;
    pc.k = static_cast<const Elem*>(p.k) + shift * p.k_batch_stride + first * p.k_row_stride;
    pc.v = static_cast<const Elem*>(p.v) + shift * p.v_batch_stride + first * p.v_row_stride;
  } else {  // ... or block-table row batch_idx[b] (FlashAttention-3's rule for paged caches)
    kb.block_table = kc.block_table + static_cast<int64_t>(row) * kc.table_stride;
  }
  fwd_main<T>(pc, ws_o, ws_lse, ws_count, var, kb, last, p.nk);  // p.nk: the capacity
}

template <class T>
__global__ void __launch_bounds__(T::kThreads)
    fwd_kernel(const FaParams p, float* ws_o, float* ws_lse, int* ws_count) {
  fwd_body<T>(p, ws_o, ws_lse, ws_count);
}
template <class T>
__global__ void __launch_bounds__(T::kThreads) fwd_variant_kernel(const FaParams p, float* ws_o,
                                                                   float* ws_lse, int* ws_count,
                                                                   const FaVariant var) {
  fwd_body<T>(p, ws_o, ws_lse, ws_count, var);
}
template <class T>
__global__ void __launch_bounds__(T::kThreads)
    fwd_cache_kernel(const FaParams p, float* ws_o, float* ws_lse, int* ws_count,
                     const FaVariant var, const FaKvCache kc) {
  fwd_body<T>(p, ws_o, ws_lse, ws_count, var, kc);
}

}  // namespace splitkv

// One extern "C" kernel per config, named by the config, for loading from a cubin.
#define SPLITKV_DEFINE_KERNEL(NAME, D, ELEM, CAUSAL, ROWS, BC, WARPS, STAGES, SPLITS)        \
  using NAME##_traits = splitkv::Traits<D, ELEM, CAUSAL, ROWS, BC, WARPS, STAGES, SPLITS>;  \
  extern "C" __global__ void __launch_bounds__(NAME##_traits::kThreads)                    \
      NAME(const FaParams p, float* ws_o, float* ws_lse, int* ws_count) {                  \
    splitkv::fwd_body<NAME##_traits>(p, ws_o, ws_lse, ws_count);                            \
  }

// A variant config (a LOCAL, SOFTCAP or SINKS switch on): every Traits argument, switches
// last; the kernel takes FaVariant after the workspace pointers.
#define SPLITKV_DEFINE_VARIANT_KERNEL(NAME, D, ELEM, CAUSAL, ROWS, BC, WARPS, STAGES, SPLITS,  \
                                      LOCAL, SOFTCAP, SINKS)                                 \
  using NAME##_traits = splitkv::VariantTraits<D, ELEM, CAUSAL, ROWS, BC, WARPS, STAGES,      \
                                               SPLITS, LOCAL, SOFTCAP, SINKS>;                \
  extern "C" __global__ void __launch_bounds__(NAME##_traits::kThreads)                    \
      NAME(const FaParams p, float* ws_o, float* ws_lse, int* ws_count, const FaVariant var) { \
    splitkv::fwd_body<NAME##_traits>(p, ws_o, ws_lse, ws_count, var);                       \
  }

// A KV-cache config: every Traits argument, the variant switches, the page size (0: a
// contiguous cache), then the capacity-split switch; the kernel takes FaVariant and FaKvCache
// after the workspace pointers, and NAME_append (kv_append.cuh) writes a call's new rows into
// the cache before it.
#define SPLITKV_DEFINE_CACHE_KERNEL(NAME, D, ELEM, CAUSAL, ROWS, BC, WARPS, STAGES, SPLITS,    \
                                    LOCAL, SOFTCAP, SINKS, PAGE, CAP_SPLIT)                  \
  using NAME##_traits = splitkv::CacheTraits<D, ELEM, CAUSAL, ROWS, BC, WARPS, STAGES, SPLITS, \
                                             LOCAL, SOFTCAP, SINKS, PAGE, CAP_SPLIT>;        \
  extern "C" __global__ void __launch_bounds__(NAME##_traits::kThreads)                    \
      NAME(const FaParams p, float* ws_o, float* ws_lse, int* ws_count, const FaVariant var,  \
           const FaKvCache kc) {                                                             \
    splitkv::fwd_body<NAME##_traits>(p, ws_o, ws_lse, ws_count, var, kc);                   \
  }                                                                                          \
  KVCACHE_DEFINE_APPEND_KERNEL(NAME)
