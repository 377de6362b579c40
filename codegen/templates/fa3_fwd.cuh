// fa2tune: FlashAttention forward, Hopper-native family "fa3" (sm_90a: wgmma + TMA + mbarriers,
// warp specialisation). Computes exactly the function of fa2_fwd.cuh (same FaParams).
//
// One thread block computes BlockM query rows of one (batch, head). Warpgroup 0 is the
// producer: one thread issues TMA loads of the Q tile and of a ring of `Stages` K and V tiles,
// each completing on a "full" mbarrier with a byte count; consumers release a stage through
// its "empty" mbarrier. Warpgroups 1..BlockM/64 are consumers, each owning 64 query rows:
//   S = Q K^T   wgmma m64 n=BlockN k16, A (Q) and B (K) from shared memory (K-major);
//   online softmax on the fp32 accumulator in registers;
//   O += P V    wgmma m64 n=D k16, P from registers (PvFromRegs, "RS") or from shared memory
//               ("SS"), V read N-major (transposed) from the same 128B-swizzled tile.
// Compile-time switches: IntraOverlap issues tile j's Q K^T together with tile j-1's P V before
// tile j's softmax; PingPong (two consumer warpgroups) orders the GEMM issue of the two
// warpgroups with named barriers so one warpgroup's softmax runs under the other's GEMMs.
//
// Shared memory (after aligning the dynamic base to 1024 bytes): every tile is stored as boxes
// of 64 columns (128 bytes of 2-byte elements) x rows, TMA's 128-byte swizzle (16-byte chunk c
// of row r at chunk c ^ (r % 8)); a D=128 tile is two boxes. Tails: TMA zero-fills rows past
// Nq/Nk and columns past D; scores of keys >= Nk are still set to -inf. Causal is bottom-right
// aligned (query i sees key j iff j <= i + nk - nq); KV tiles wholly above the diagonal are
// never loaded; a row that sees no key gets O = 0 and LSE = -inf.
//
// Variable lengths (Varlen, the `_vl` configs, FA3_DEFINE_VARLEN_KERNEL): Q, K, V and O are
// packed, one row per token of every sequence ([total, heads, D], the TMA descriptors are over
// the packed tensors with a batch extent of 1) and fa3::VarlenArgs (FaVarlen's bytes) says
// where each sequence starts; blockIdx.z is the sequence. A tile is loaded from the sequence's
// first row on, so its rows past the sequence's end are the next sequence's (or TMA's zero
// fill past the tensor's end): keys there are masked to -inf as the dense kernel masks keys
// past nk (with the sequence's nk), and O and LSE rows past the sequence's nq are never
// stored. FaParams then holds the longest lengths (they size the grid), batch is the number
// of sequences, the batch strides are unused and LSE is [q_heads, total_q].
//
// Launch order of causal blocks (the blocks of a causal call do unequal work: the bottom
// m-block of a head sees every key, the top one a single tile). By default blockIdx.x is
// reversed, so each head's longest blocks start first. LongestFirst (the `_lf` configs, dense
// causal only) orders across heads instead: the linear block index walks m-blocks from the
// bottom up over a chunk of (head, batch) pairs whose K/V fit kLongestFirstL2Bytes of L2,
// then the next chunk, so a wave's blocks share K/V and the last blocks to start are the
// shortest. Measured on the H200 (docs/performance.md, "Changes to the template", 9): faster
// at long N, slower at short N with many heads; a tuned choice, not a rule.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "fa3_ptx.cuh"
#include "fa3_wgmma.cuh"
#include "fa_mask.cuh"
#include "fa_params.cuh"
#include "fa_softmax.cuh"
#include "kv_append.cuh"  // the cache kernels' append

// The kernels need sm_90a. FA3_TEMPLATES_ONLY (fa3_launch.cuh defines it around this include)
// says the includer compiles no fa3 kernel body for a target without the sm_90a features, it
// only needs the templates declared; then the check is left to it. nvcc defines
// __CUDA_ARCH_FEAT_SM90_ALL; nothing here defines it.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(FA3_TEMPLATES_ONLY)
#error "fa3_fwd.cuh needs sm_90a: compile with -gencode=arch=compute_90a,code=sm_90a"
#endif

namespace fa3 {

using fa::fast_exp2;

// Limits of one SM of compute capability 9.0.
constexpr int kMaxSmemPerBlock = 227 * 1024;  // 232448 bytes of dynamic shared memory
constexpr int kRegsPerSm = 65536;

// ---------------------------------------------------------------------------------------------
// Every constant of one instantiation, derived from its parameters and checked here.
// The varlen kernels' second argument: the bytes of FaVarlen (fa2_fwd.cuh), which this family's
// headers do not include (a translation unit may hold both families), under its own name.
struct VarlenArgs {
  const int32_t* cu_seqlens_q;  // [batch + 1]: sequence b's query rows are [cu[b], cu[b+1])
  const int32_t* cu_seqlens_k;  // [batch + 1]: ... and its key rows
  int32_t total_q;              // cu_seqlens_q[batch]: the row length of LSE [q_heads, total_q]
  int32_t reserved;             // 0
};
static_assert(sizeof(VarlenArgs) == 24 && alignof(VarlenArgs) == 8, "FaVarlen's ABI");

// Varlen_ and LongestFirst_ come last and default to false, so a config without them spells
// its Traits as before; after them the attention-variant switches (fa_mask.cuh's policies,
// the run-time values in FaVariant, the kernel's last argument), off by default likewise, and
// the KV-cache layout (Page_: -1 not a cache kernel, 0 a contiguous cache, P pages of P keys;
// FA3_DEFINE_CACHE_KERNEL below).
template <int D_, typename Elem_, bool Causal_, int BlockM_, int BlockN_, int Stages_,
          bool PvFromRegs_, bool IntraOverlap_, bool PingPong_, int ConsumerRegs_,
          bool Varlen_ = false, bool LongestFirst_ = false, bool Local_ = false,
          bool Softcap_ = false, bool Sinks_ = false, int Page_ = -1>
struct Traits {
  using Elem = Elem_;
  static constexpr int D = D_;
  static constexpr bool Causal = Causal_;
  static constexpr int BlockM = BlockM_;
  static constexpr int BlockN = BlockN_;
  static constexpr int Stages = Stages_;
  static constexpr bool PvFromRegs = PvFromRegs_;
  static constexpr bool IntraOverlap = IntraOverlap_;
  static constexpr bool PingPong = PingPong_;
  static constexpr int ConsumerRegs = ConsumerRegs_;
  static constexpr bool Varlen = Varlen_;
  static constexpr bool LongestFirst = LongestFirst_;
  static constexpr bool Local = Local_;      // window / chunk mask (fa::LocalMask)
  static constexpr bool Softcap = Softcap_;  // logit softcap (fa::SoftcapScore)
  static constexpr bool Sinks = Sinks_;      // per-head sink logits in the denominator
  // A variant kernel takes FaVariant as its last argument; a plain one does not.
  static constexpr bool kVariant = Local || Softcap || Sinks;
  // A KV-cache kernel (fwd_body's "KV caches"): dense queries over keys read from a cache,
  // each sequence's key count read on the device; it takes FaVariant and FaKvCache last.
  static constexpr bool kCache = Page_ >= 0;
  static constexpr int kPage = Page_ > 0 ? Page_ : 0;  // 0: a contiguous cache (or none)
  // Whether a block's key count is bc.nk (packed or cached sequences), not FaParams' nk.
  static constexpr bool kSeqK = Varlen || kCache;
  // Rows of one K/V TMA box: a tile's, or a page's where a page holds less than a tile (each
  // box then lands 8-row aligned in the tile, so the 128-byte swizzle is the whole tile's).
  static constexpr int kKVBoxRows = (kPage > 0 && kPage < BlockN) ? kPage : BlockN;
  static constexpr int kKVLoads = BlockN / kKVBoxRows;  // boxes per tile and 64 columns

  static constexpr int kConsumerWGs = BlockM / 64;
  static constexpr int kThreads = (kConsumerWGs + 1) * 128;
  static constexpr int kBoxCols = 64;  // one 128-byte swizzle row of 2-byte elements
  static constexpr int kDBoxes = (D + kBoxCols - 1) / kBoxCols;
  static constexpr int kQBoxBytes = BlockM * 128;
  static constexpr int kKVBoxBytes = BlockN * 128;
  static constexpr int kQBytes = kDBoxes * kQBoxBytes;    // TMA transaction bytes of Q
  static constexpr int kKVBytes = kDBoxes * kKVBoxBytes;  // ... of one K or V stage
  static constexpr int kPBoxes = (BlockN + kBoxCols - 1) / kBoxCols;
  static constexpr int kPBytesPerWG = PvFromRegs ? 0 : kPBoxes * 64 * 128;
  // Byte offsets from the 1024-aligned base.
  static constexpr int kQOff = 0;
  static constexpr int kKOff = kQOff + kQBytes;
  static constexpr int kVOff = kKOff + Stages * kKVBytes;
  static constexpr int kPOff = kVOff + Stages * kKVBytes;
  static constexpr int kBarOff = kPOff + kConsumerWGs * kPBytesPerWG;
  static constexpr int kBarBytes = 8 * (1 + 4 * Stages);
  static constexpr int kAlignSlack = 1024;  // the dynamic base is aligned up to 1024 bytes
  // The host's formula (docs/fa3_kernel.md): 1024 + 128*ceil(D/64)*(BlockM + 2*Stages*BlockN)
  //   + (SS ? (BlockM/64)*ceil(BlockN/64)*8192 : 0) + 256.
  static constexpr int kSmemBytes = kAlignSlack + kBarOff + 256;

  // Registers: the launch bound gives every thread kLaunchRegs; setmaxnreg then moves them
  // from the producer warpgroup to the consumers.
  static constexpr int kLaunchRegs = (kRegsPerSm / kThreads) > 255 ? 248 : ((kRegsPerSm / kThreads) & ~7);
  static constexpr bool kSplitRegs = kConsumerWGs > 1;
  static constexpr int kProducerRegsRaw =
      ((kThreads * kLaunchRegs - kConsumerWGs * 128 * ConsumerRegs) / 128) & ~7;
  static constexpr int kProducerRegs = kProducerRegsRaw > 56 ? 56 : kProducerRegsRaw;
  // fp32 accumulator registers a consumer thread keeps live: S and O, plus the packed P of the
  // previous tile while the next S is computed (RS with intra-warpgroup overlap).
  static constexpr int kAccRegs =
      BlockN / 2 + D / 2 + (IntraOverlap && PvFromRegs ? BlockN / 4 : 0);
  static constexpr int kRegHeadroom = 32;  // indices, softmax state, descriptors, addresses

  static_assert(std::is_same_v<Elem, __half> || std::is_same_v<Elem, __nv_bfloat16>,
                "fp16 or bf16");
  static_assert(D % 32 == 0 && D >= 32 && D <= 256, "head dim: a multiple of 32 in 32..256");
  static_assert(BlockM == 64 || BlockM == 128 || BlockM == 192, "BlockM in {64, 128, 192}");
  static_assert(BlockN % 16 == 0 && BlockN >= 64 && BlockN <= 192,
                "BlockN a multiple of 16 in 64..192");
  static_assert(Stages >= 2 && Stages <= 4, "2..4 K/V stages");
  static_assert(!PingPong || kConsumerWGs == 2, "ping-pong needs exactly 2 consumer warpgroups");
  static_assert(!LongestFirst || (Causal && !Varlen),
                "longest-first order is for dense causal configs (the only unequal blocks)");
  static_assert(!kCache || (!Varlen && !LongestFirst), "a cache kernel is dense, tile order");
  static_assert(Page_ <= 0 || (Page_ & (Page_ - 1)) == 0, "the page size is a power of two");
  static_assert(kPage == 0 || kPage % BlockN == 0 ||
                    (BlockN % (kPage > 0 ? kPage : 1) == 0 && kPage >= 8),
                "a page holds whole key tiles, or whole 8-row swizzle atoms of one");
  static_assert(kSmemBytes <= kMaxSmemPerBlock, "shared memory over 227 KB");
  static_assert(ConsumerRegs % 8 == 0 && ConsumerRegs >= 24 && ConsumerRegs <= 256,
                "setmaxnreg takes a multiple of 8 in 24..256");
  static_assert(!kSplitRegs || ConsumerRegs >= kLaunchRegs,
                "consumers cannot have fewer registers than the launch gives");
  static_assert(!kSplitRegs || kProducerRegs >= 24, "register split: producer below 24");
  static_assert(!kSplitRegs || 128 * (kProducerRegs + kConsumerWGs * ConsumerRegs) <=
                                   kThreads * kLaunchRegs,
                "register split exceeds the block's registers");
  static_assert(kAccRegs + kRegHeadroom <= (kSplitRegs ? ConsumerRegs : 255),
                "accumulators do not fit the consumer register budget");
};

template <typename Elem>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<Elem, __half>) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

template <int N>
__device__ __forceinline__ void fence_regs_u32(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int k = 0; k < 4; ++k) asm volatile("" : "+r"(r[i][k])::"memory");
}

// Barrier addresses: q_full, then k_full[S], v_full[S], k_empty[S], v_empty[S].
template <class T>
struct Bars {
  uint32_t base;
  __device__ __forceinline__ uint32_t q_full() const { return base; }
  __device__ __forceinline__ uint32_t k_full(int s) const { return base + 8 * (1 + s); }
  __device__ __forceinline__ uint32_t v_full(int s) const { return base + 8 * (1 + T::Stages + s); }
  __device__ __forceinline__ uint32_t k_empty(int s) const {
    return base + 8 * (1 + 2 * T::Stages + s);
  }
  __device__ __forceinline__ uint32_t v_empty(int s) const {
    return base + 8 * (1 + 3 * T::Stages + s);
  }
};

// Tile coordinates of one thread block. The second line is set and read by varlen
// instantiations only (dense ones read FaParams where they always did, so their code is
// unchanged): the sequence's lengths, and the TMA rows of its Q tile and of its key 0 in the
// packed tensors. n_first, the block's first key tile, is set and read by Local
// instantiations only (the others start at tile 0, a constant): the block walks key tiles
// [n_first, n_first + n_tiles), the producer and every consumer alike.
struct BlockCoord {
  int m0, head, kv_head, batch, n_tiles;
  int nq, nk, q_row, k_row;
  int n_first;
};

// The mask policy of a sequence of nq queries and nk keys: the Causal switch's for plain and
// non-local kernels (the window is not read), LocalMask with the call's window for Local
// ones; a causal config's window ends at the diagonal whatever the call's right bound says
// (core.variant.normalize passes 0 there), so its kernel is causal as its name says.
template <class T>
__device__ __forceinline__ fa::VariantMask<T::Causal, T::Local> variant_mask(
    int nq, int nk, const FaVariant& var) {
  const int right = (T::Local && T::Causal) ? 0 : var.window_right;
  return fa::VariantMask<T::Causal, T::Local>(nq, nk, var.window_left, right, var.chunk);
}

// The block's first key tile: a window's or chunk's n_block_min, else 0 (compile-time).
template <class T>
__device__ __forceinline__ int first_tile(const BlockCoord& bc) {
  if constexpr (T::Local)
    return bc.n_first;
  else
    return 0;
}

// ---------------------------------------------------------------------------------------------
// A cache kernel's TMA coordinates (row, batch) of its key `key`: in a contiguous cache row
// `first + key` of cache row `cache_row` (first: the sequence's left padding); in a paged one row key % Page of page table[key / Page] (the
// K/V descriptors see the pages as the batch: [pages, Page, kv_heads, D]). A box past the
// sequence's last key reads the last key's page, whose rows there the mask hides.
template <class T>
__device__ __forceinline__ void cache_coord(int key, int nk, const int32_t* table, int cache_row,
                                            int first, int* row, int* batch) {
  if constexpr (T::kPage > 0) {
    const int page = table[min(key, nk - 1) / T::kPage];
    *row = key % T::kPage;
    *batch = page;
  } else {
    *row = first + key;
    *batch = cache_row;
  }
}

// A cache kernel's K or V tile of stage st: kKVLoads boxes of kKVBoxRows rows per 64 columns.
template <class T>
__device__ __forceinline__ void load_cache_tile(uint32_t dst, const CUtensorMap* map,
                                                uint32_t bar, int key0, int kv_head, int nk,
                                                const int32_t* table, int cache_row,
                                                int first) {
#pragma unroll
  for (int l = 0; l < T::kKVLoads; ++l) {
    int row, batch;
    cache_coord<T>(key0 + l * T::kKVBoxRows, nk, table, cache_row, first, &row, &batch);
#pragma unroll
    for (int b = 0; b < T::kDBoxes; ++b)
      tma_load_4d(dst + b * T::kKVBoxBytes + l * T::kKVBoxRows * 128, map, bar, b * T::kBoxCols,
                  row, kv_head, batch);
  }
}

template <class T>
__device__ __forceinline__ void producer(const BlockCoord& bc, uint32_t sbase, Bars<T> bars,
                                         const CUtensorMap* tq, const CUtensorMap* tk,
                                         const CUtensorMap* tv, const int32_t* table = nullptr,
                                         int cache_row = 0, int first = 0) {
  constexpr int S = T::Stages;
  // Packed tensors are one batch; their sequences start at row offsets instead.
  const int tma_batch = T::Varlen ? 0 : bc.batch;
  const int k_row0 = T::Varlen ? bc.k_row : 0;
  tma_prefetch_desc(tq);
  tma_prefetch_desc(tk);
  tma_prefetch_desc(tv);
  mbar_arrive_expect_tx(bars.q_full(), T::kQBytes);
#pragma unroll
  for (int b = 0; b < T::kDBoxes; ++b)
    tma_load_4d(sbase + T::kQOff + b * T::kQBoxBytes, tq, bars.q_full(), b * T::kBoxCols,
                T::Varlen ? bc.q_row : bc.m0, bc.head, tma_batch);
  for (int j = 0; j < bc.n_tiles; ++j) {
    const int st = j % S;
    const uint32_t empty_parity = ((j / S) + 1) & 1;  // phase of the release of tile j - S
    // Stages and phases count the block's tiles from 0; the rows are those of the tile's keys.
    const int row = k_row0 + (first_tile<T>(bc) + j) * T::BlockN;
    if constexpr (T::kCache) {  // the same stages and barriers, the cache's coordinates
      if (j >= S) mbar_wait(bars.k_empty(st), empty_parity);
      mbar_arrive_expect_tx(bars.k_full(st), T::kKVBytes);
      load_cache_tile<T>(sbase + T::kKOff + st * T::kKVBytes, tk, bars.k_full(st), row,
                         bc.kv_head, bc.nk, table, cache_row, first);
      if (j >= S) mbar_wait(bars.v_empty(st), empty_parity);
      mbar_arrive_expect_tx(bars.v_full(st), T::kKVBytes);
      load_cache_tile<T>(sbase + T::kVOff + st * T::kKVBytes, tv, bars.v_full(st), row,
                         bc.kv_head, bc.nk, table, cache_row, first);
      continue;
    }
    if (j >= S) mbar_wait(bars.k_empty(st), empty_parity);
    mbar_arrive_expect_tx(bars.k_full(st), T::kKVBytes);
#pragma unroll
    for (int b = 0; b < T::kDBoxes; ++b)
      tma_load_4d(sbase + T::kKOff + st * T::kKVBytes + b * T::kKVBoxBytes, tk, bars.k_full(st),
                  b * T::kBoxCols, row, bc.kv_head, tma_batch);
    if (j >= S) mbar_wait(bars.v_empty(st), empty_parity);
    mbar_arrive_expect_tx(bars.v_full(st), T::kKVBytes);
#pragma unroll
    for (int b = 0; b < T::kDBoxes; ++b)
      tma_load_4d(sbase + T::kVOff + st * T::kKVBytes + b * T::kKVBoxBytes, tv, bars.v_full(st),
                  b * T::kBoxCols, row, bc.kv_head, tma_batch);
  }
}

// ---------------------------------------------------------------------------------------------
// The consumer warpgroup's pieces, in the order a key tile meets them (FlashAttention-3 composes
// its consumer from a mainloop, a softmax and an epilogue alike):
//   gemm_qk      S = Q K^T                     mask_scores  score policy, then the mask
//   softmax_rows the online softmax (alpha)    rescale_rows O *= alpha
//   store_p      P as the P V GEMM's operand   gemm_pv      O += P V
// and the epilogue: stage_o (normalised O into shared memory), store_lse, store_o. consumer()
// sets up the accumulators and descriptors and runs the mainloop (serial, or IntraOverlap: tile
// j's Q K^T issued with tile j-1's P V; PingPong orders the two warpgroups' GEMM issue).
// Each piece takes what it reads and writes as arguments; the accumulators stay consumer()'s
// arrays (bench/ptx_identity.py: the shipped kernels' PTX is byte for byte what the single
// function made; bundling the state in a struct, or the whole epilogue in one function,
// renumbered the PTX's registers).

// S = Q K^T of the key tile in stage st (wgmma, A and B from shared memory).
template <class T>
__device__ __forceinline__ void gemm_qk(float (&s)[T::BlockN / 2], uint64_t q_desc,
                                        uint64_t k_desc, int st) {
  const uint64_t kd = desc_advance(k_desc, st * T::kKVBytes);
#pragma unroll
  for (int ks = 0; ks < T::D / 16; ++ks) {
    const uint32_t qoff = (ks / 4) * T::kQBoxBytes + (ks % 4) * 32;
    const uint32_t koff = (ks / 4) * T::kKVBoxBytes + (ks % 4) * 32;
    Wgmma<T::BlockN>::template ss<typename T::Elem, 0>(s, desc_advance(q_desc, qoff),
                                                       desc_advance(kd, koff), ks > 0 ? 1 : 0);
  }
}

// O += P V of the value tile in stage st: wgmma with P from registers (RS, PvFromRegs) or
// from shared memory (SS), V N-major from its 128B-swizzled tile.
template <class T>
__device__ __forceinline__ void gemm_pv(float (&o)[T::D / 2],
                                        const uint32_t (&pf)[T::PvFromRegs ? T::BlockN / 16 : 1][4],
                                        uint64_t v_desc, uint64_t p_desc, int st) {
  using Elem = typename T::Elem;
  const uint64_t vd = desc_advance(v_desc, st * T::kKVBytes);
#pragma unroll
  for (int kk = 0; kk < T::BlockN / 16; ++kk) {
    if constexpr (T::PvFromRegs) {
      Wgmma<T::D>::template rs<Elem, 1>(o, pf[kk], desc_advance(vd, kk * 2048), 1);
    } else {
      const uint32_t poff = (kk / 4) * 8192 + (kk % 4) * 32;
      Wgmma<T::D>::template ss<Elem, 1>(o, desc_advance(p_desc, poff),
                                        desc_advance(vd, kk * 2048), 1);
    }
  }
}

// The score policy, then -inf for the keys a row does not see: keys past the sequence's end
// (the next sequence's rows when packed) and those the mask policy hides. Only tiles that
// reach past the last key or the policy's edge pay for the element mask; with a left bound
// (a window or chunk: Mask::kLeftBound) also those starting before the left edge of the
// warpgroup's last row, so the masked tiles are the first ones of the block as well as the
// last. The sequence's nk is read where it is used (FaParams' when dense), as the kernel
// always has. j is the key tile's index in the sequence (not in the block's range).
template <class T, class Score, class Mask>
__device__ __forceinline__ void mask_scores(float (&s)[T::BlockN / 2], const FaParams& p,
                                            const BlockCoord& bc, const Score& score,
                                            const Mask& mask, int j, int wg_row0, int row_g,
                                            int t) {
  constexpr int BN = T::BlockN;
  const int n0 = j * BN;
  score.apply(s);
  if constexpr (Mask::kLeftBound) {
    const bool need_mask = (n0 + BN > mask.nk) || (n0 + BN - 1 > mask.edge_key(wg_row0)) ||
                           (n0 < mask.begin_edge(wg_row0 + 63));
    if (need_mask) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row_g + 8 * h;
        // element (i, e) is key n0 + 2t + 8i + e: visible iff lo <= 8i + e < hi
        const int lo = mask.key_begin(row) - n0 - 2 * t;
        const int hi = mask.key_limit(row) - n0 - 2 * t;
#pragma unroll
        for (int i = 0; i < BN / 8; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (8 * i + e < lo || 8 * i + e >= hi) s[4 * i + 2 * h + e] = fa::kNegInf;
      }
    }
  } else {
    const bool need_mask =
        (n0 + BN > (T::kSeqK ? bc.nk : p.nk)) || (n0 + BN - 1 > mask.edge_key(wg_row0));
    if (need_mask) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int limit =  // keys < limit are visible
            Mask::of_diag(T::kSeqK ? bc.nk : p.nk, mask.diag).key_limit(row_g + 8 * h);
        const int rel = limit - n0 - 2 * t;  // element (i, e) is masked iff 8i + e >= rel
#pragma unroll
        for (int i = 0; i < BN / 8; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (8 * i + e >= rel) s[4 * i + 2 * h + e] = fa::kNegInf;
      }
    }
  }
}

// The online softmax of this thread's two rows (fa_softmax.cuh's pieces on wgmma's C
// fragment): new row maxima, P = exp2(S - max) in place, running sums; alpha[h] rescales O.
template <class T>
__device__ __forceinline__ void softmax_rows(float (&s)[T::BlockN / 2], float (&row_max)[2],
                                             float (&row_sum)[2], float (&alpha)[2],
                                             float scale_log2) {
  constexpr int BN = T::BlockN;
  auto at = [&](int i, int k) -> float& { return s[4 * i + k]; };
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float mx = fa::quad_max(fa::row_max_of<BN / 8>(at, h, row_max[h]));
    const fa::RowStep step = fa::online_step(row_max[h], mx, scale_log2);
    alpha[h] = step.alpha;
    const float sum = fa::exp_row<BN / 8>(at, h, scale_log2, step.m_scaled);
    row_sum[h] = row_sum[h] * alpha[h] + sum;
  }
}

// O *= alpha per row.
template <class T>
__device__ __forceinline__ void rescale_rows(float (&o)[T::D / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < T::D / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      o[4 * i + 2 * h] *= alpha[h];
      o[4 * i + 2 * h + 1] *= alpha[h];
    }
}

// P (fp16/bf16) for the P V GEMM: the S accumulator of two adjacent n8 blocks is exactly the
// m64k16 A fragment, so RS packs in place; SS stores it 128B-swizzled for a descriptor.
template <class T>
__device__ __forceinline__ void store_p(const float (&s)[T::BlockN / 2],
                                        uint32_t (&pf)[T::PvFromRegs ? T::BlockN / 16 : 1][4],
                                        unsigned char* gbase, int wc, int warp, int g, int t) {
  using Elem = typename T::Elem;
  constexpr int BN = T::BlockN;
  if constexpr (T::PvFromRegs) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      pf[kk][0] = pack2<Elem>(s[8 * kk + 0], s[8 * kk + 1]);
      pf[kk][1] = pack2<Elem>(s[8 * kk + 2], s[8 * kk + 3]);
      pf[kk][2] = pack2<Elem>(s[8 * kk + 4], s[8 * kk + 5]);
      pf[kk][3] = pack2<Elem>(s[8 * kk + 6], s[8 * kk + 7]);
    }
  } else {
    unsigned char* pw = gbase + T::kPOff + wc * T::kPBytesPerWG;
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 16 * warp + g + 8 * h;  // r % 8 == g
        const int off = (i / 8) * 8192 + r * 128 + (((i % 8) ^ g) * 16) + 4 * t;
        *reinterpret_cast<uint32_t*>(pw + off) =
            pack2<Elem>(s[4 * i + 2 * h], s[4 * i + 2 * h + 1]);
      }
    fence_proxy_async();
    named_bar_sync(3 + wc, 128);
  }
}

// O normalised (times inv per row) as fp16/bf16 into this warpgroup's rows of the Q buffer,
// 128B-swizzled as the Q tile: only this warpgroup's GEMMs read those rows, all complete.
template <class T>
__device__ __forceinline__ void stage_o(float (&o)[T::D / 2], const float (&inv)[2],
                                        unsigned char* gbase, int wc, int warp, int g, int t) {
  unsigned char* qw = gbase + T::kQOff;
#pragma unroll
  for (int i = 0; i < T::D / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 64 * wc + 16 * warp + g + 8 * h;  // row in the Q tile; r % 8 == g
      const int off = (i / 8) * T::kQBoxBytes + r * 128 + (((i % 8) ^ g) * 16) + 4 * t;
      *reinterpret_cast<uint32_t*>(qw + off) =
          pack2<typename T::Elem>(o[4 * i + 2 * h] * inv[h], o[4 * i + 2 * h + 1] * inv[h]);
    }
}

// This thread's two rows of LSE (natural log; -inf for a row that saw no key), rows from the
// sequence's nq on left alone. LSE is [batch, q_heads, nq] dense, [q_heads, total_q] packed.
// The row max is in the units the score policy left (score.softmax_scale: FaParams' scale, or
// the cap with softcap); with sinks lsum includes the sink, so LSE does too.
template <class T, class Score>
__device__ __forceinline__ void store_lse(const FaParams& p, const BlockCoord& bc,
                                          const VarlenArgs& vl, const Score& score, int seq_q0,
                                          int seq_nq, const float (&row_max)[2],
                                          const float (&lsum)[2], int row_g) {
  float* lse = p.lse + (T::Varlen ? static_cast<int64_t>(bc.head) * vl.total_q + seq_q0
                                  : (static_cast<int64_t>(bc.batch) * p.q_heads + bc.head) *
                                        p.nq);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row_g + 8 * h;
    if (row < (T::Varlen ? seq_nq : p.nq))
      lse[row] = lsum[h] > 0.f ? row_max[h] * score.softmax_scale(p.softmax_scale) + logf(lsum[h])
                               : fa::kNegInf;
  }
}

// O from its staging rows in shared memory to global memory, 16-byte row stores; rows from
// the sequence's nq on (seq_nq packed, p.nq dense: read here) are not stored (packed: they are
// the next sequence's).
template <class T>
__device__ __forceinline__ void store_o(const FaParams& p, const BlockCoord& bc,
                                        const unsigned char* gbase, int seq_q0, int seq_nq, int wc,
                                        int tid, int wg_row0) {
  using Elem = typename T::Elem;
  Elem* gO = static_cast<Elem*>(p.o) +
             (T::Varlen ? seq_q0 * p.o_row_stride + bc.head * p.o_head_stride
                        : bc.batch * p.o_batch_stride + bc.head * p.o_head_stride);
  constexpr int kChunks = T::D / 8;  // 16-byte chunks per row
  const unsigned char* qr = gbase + T::kQOff;
#pragma unroll 4
  for (int idx = tid; idx < 64 * kChunks; idx += 128) {
    const int r = idx / kChunks, c = idx % kChunks;
    const int row = wg_row0 + r;
    if (row < (T::Varlen ? seq_nq : p.nq)) {
      const int rr = 64 * wc + r;
      const uint4 val = *reinterpret_cast<const uint4*>(
          qr + (c / 8) * T::kQBoxBytes + rr * 128 + (((c % 8) ^ (rr % 8)) * 16));
      *reinterpret_cast<uint4*>(gO + static_cast<int64_t>(row) * p.o_row_stride + c * 8) = val;
    }
  }
}

// ---------------------------------------------------------------------------------------------
template <class T>
__device__ __forceinline__ void consumer(const FaParams& p, const BlockCoord& bc, uint32_t sbase,
                                         unsigned char* gbase, Bars<T> bars, int wc,
                                         const VarlenArgs& vl, const FaVariant& var) {
  using Elem = typename T::Elem;
  // Plain kernels: the Causal switch's policy and the identity (the window and cap unread).
  using Mask = fa::VariantMask<T::Causal, T::Local>;
  using Score = fa::ScoreFor<T::Softcap>;
  constexpr int D = T::D, BN = T::BlockN, S = T::Stages;
  constexpr float kNegInf = fa::kNegInf;
  constexpr float kLog2e = fa::kLog2e;

  const int tid = threadIdx.x % 128;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  // This sequence's lengths: FaParams' when dense, cu_seqlens' when packed; read where they
  // are used, as the dense kernel always has (its code stays the same).
  auto len_q = [&]() { return T::Varlen ? bc.nq : p.nq; };
  auto len_k = [&]() { return T::kSeqK ? bc.nk : p.nk; };
  const Mask mask = variant_mask<T>(len_q(), len_k(), var);
  const Score score(p.softmax_scale, var.softcap);
  const float scale_log2 = score.softmax_scale(p.softmax_scale) * kLog2e;
  const int wg_row0 = bc.m0 + 64 * wc;
  const int row_g = wg_row0 + 16 * warp + g;  // global row of this thread's h = 0 elements
  const int n_tiles = bc.n_tiles;

  // Descriptors: Q (A, K-major), K (B, K-major), V (B, N-major: LBO steps over 64-column
  // boxes of D, SBO over 8-key atoms), P (A, K-major) in SS mode.
  const uint64_t q_desc = make_desc_sw128(sbase + T::kQOff + wc * 64 * 128, 16, 1024);
  const uint64_t k_desc = make_desc_sw128(sbase + T::kKOff, 16, 1024);
  const uint64_t v_desc = make_desc_sw128(sbase + T::kVOff, T::kKVBoxBytes, 1024);
  const uint64_t p_desc = make_desc_sw128(sbase + T::kPOff + wc * T::kPBytesPerWG, 16, 1024);

  float o[D / 2];
  float s[BN / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) s[i] = 0.f;
  float row_max[2] = {kNegInf, kNegInf};
  float row_sum[2] = {0.f, 0.f};  // per-thread partial sums; reduced over the quad at the end
  if constexpr (T::Sinks) {
    // The sink as one more key of value zero: the running max starts at its logit and its
    // exp(0) = 1 joins the sum once per row (thread t == 0 of the quad).
    if (var.sinks != nullptr) {
      const float m = fa::sink_row_max(var.sinks[bc.head], score.softmax_scale(p.softmax_scale));
      row_max[0] = row_max[1] = m;
      row_sum[0] = row_sum[1] = t == 0 ? 1.f : 0.f;
    }
  }
  uint32_t pf[T::PvFromRegs ? BN / 16 : 1][4];

  auto qk = [&](int st) { gemm_qk<T>(s, q_desc, k_desc, st); };
  auto pv = [&](int st) { gemm_pv<T>(o, pf, v_desc, p_desc, st); };
  auto fence_all = [&]() {
    fence_regs(o);
    fence_regs(s);
    if constexpr (T::PvFromRegs) fence_regs_u32(pf);
  };

  // Masks, new row maxima, exponentials in place, running sums; alpha rescales O.
  auto softmax = [&](int j, float (&alpha)[2]) {
    mask_scores<T>(s, p, bc, score, mask, first_tile<T>(bc) + j, wg_row0, row_g, t);
    softmax_rows<T>(s, row_max, row_sum, alpha, scale_log2);
  };
  auto rescale_o = [&](const float (&alpha)[2]) { rescale_rows<T>(o, alpha); };
  auto make_p = [&]() { store_p<T>(s, pf, gbase, wc, warp, g, t); };

  // Ping-pong: GEMM issue is a critical section taken in turn (barrier 1 + wc, arrived at by
  // the other warpgroup). Warpgroup 1 opens warpgroup 0's first turn and skips its very last
  // arrive, so every bar.sync meets exactly one bar.arrive.
  auto pp_begin = [&]() {
    if constexpr (T::PingPong) named_bar_sync(1 + wc, 256);
  };
  auto pp_end = [&](bool last) {
    if constexpr (T::PingPong) {
      if (!(last && wc == 1)) named_bar_arrive(1 + (wc ^ 1), 256);
    }
  };
  auto release = [&](uint32_t bar) {
    if (lane == 0) mbar_arrive(bar);
  };

  if constexpr (T::PingPong) {
    if (wc == 1) named_bar_arrive(1, 256);
  }
  mbar_wait(bars.q_full(), 0);

  if constexpr (T::IntraOverlap) {
    mbar_wait(bars.k_full(0), 0);
    pp_begin();
    fence_all();
    wgmma_fence();
    qk(0);
    wgmma_commit();
    pp_end(false);
    wgmma_wait<0>();
    fence_regs(s);
    release(bars.k_empty(0));
    {
      float alpha[2];
      softmax(0, alpha);  // O is still zero: nothing to rescale
    }
    make_p();
    for (int j = 1; j < n_tiles; ++j) {
      const int st = j % S, sp = (j - 1) % S;
      mbar_wait(bars.k_full(st), (j / S) & 1);
      mbar_wait(bars.v_full(sp), ((j - 1) / S) & 1);  // both waits before the issue: no
      pp_begin();                                       // branch between the two batches
      fence_all();
      wgmma_fence();
      qk(st);
      wgmma_commit();
      pv(sp);
      wgmma_commit();
      pp_end(false);
      wgmma_wait<1>();  // S of tile j is ready; P V of tile j - 1 may still run
      fence_regs(s);
      release(bars.k_empty(st));
      float alpha[2];
      softmax(j, alpha);
      wgmma_wait<0>();
      fence_regs(o);
      if constexpr (T::PvFromRegs) fence_regs_u32(pf);
      release(bars.v_empty(sp));
      rescale_o(alpha);
      make_p();
    }
    const int last = n_tiles - 1;
    mbar_wait(bars.v_full(last % S), (last / S) & 1);
    pp_begin();
    fence_all();
    wgmma_fence();
    pv(last % S);
    wgmma_commit();
    pp_end(true);
    wgmma_wait<0>();
    fence_regs(o);
    release(bars.v_empty(last % S));
  } else {
    for (int j = 0; j < n_tiles; ++j) {
      const int st = j % S;
      const uint32_t ph = (j / S) & 1;
      mbar_wait(bars.k_full(st), ph);
      pp_begin();
      fence_all();
      wgmma_fence();
      qk(st);
      wgmma_commit();
      pp_end(false);
      wgmma_wait<0>();
      fence_regs(s);
      release(bars.k_empty(st));
      float alpha[2];
      softmax(j, alpha);
      rescale_o(alpha);
      make_p();
      mbar_wait(bars.v_full(st), ph);
      pp_begin();
      fence_all();
      wgmma_fence();
      pv(st);
      wgmma_commit();
      pp_end(j == n_tiles - 1);
      wgmma_wait<0>();
      fence_regs(o);
      if constexpr (T::PvFromRegs) fence_regs_u32(pf);
      release(bars.v_empty(st));
    }
  }

  // Epilogue: normalise; stage O (fp16/bf16) in this warpgroup's rows of the Q buffer, which
  // only this warpgroup's GEMMs read and all of them are complete; then 16-byte row stores.
  // Packed: the sequence's first row and length are read again here rather than kept in
  // registers through the main loop (the dense kernel reads FaParams).
  int seq_q0 = 0, seq_nq = 0;
  if constexpr (T::Varlen) {
    seq_q0 = vl.cu_seqlens_q[bc.batch];
    seq_nq = vl.cu_seqlens_q[bc.batch + 1] - seq_q0;
  }
  auto out_rows = [&]() { return T::Varlen ? seq_nq : p.nq; };
  float inv[2], lsum[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = fa::quad_sum(row_sum[h]);
    lsum[h] = l;
    inv[h] = l > 0.f ? 1.f / l : 0.f;
  }
  stage_o<T>(o, inv, gbase, wc, warp, g, t);
  if (p.lse != nullptr && t == 0)
    store_lse<T>(p, bc, vl, score, seq_q0, seq_nq, row_max, lsum, row_g);
  named_bar_sync(3 + wc, 128);
  store_o<T>(p, bc, gbase, seq_q0, seq_nq, wc, tid, wg_row0);
}

// ---------------------------------------------------------------------------------------------
// L2 bytes the K and V of one chunk of (head, batch) pairs may take in longest-first order: a
// third of the H100/H200's 50 MB, so the chunk stays resident beside Q, O and other traffic.
constexpr long long kLongestFirstL2Bytes = 16ll << 20;

// The (m-block, head, batch) of this block in longest-first order (see the top). The grid is
// the usual (m-blocks, q_heads, batch); only the mapping of its linear index changes.
template <class T>
__device__ __forceinline__ void block_coord_longest_first(const FaParams& p, BlockCoord* bc) {
  const int m_blocks = gridDim.x, heads = gridDim.y;
  const int pairs = gridDim.y * gridDim.z;  // (head, batch)
  // K and V bytes per query head: a KV head's are shared by its q_heads / kv_heads heads,
  // which are consecutive in the chunk.
  const long long kv_bytes = max(
      1ll, static_cast<long long>(p.nk) * T::D * 2 * 2 / (p.q_heads / p.kv_heads));
  const int chunk_pairs = static_cast<int>(
      max(1ll, min(static_cast<long long>(pairs), kLongestFirstL2Bytes / kv_bytes)));
  const int lin = blockIdx.x + m_blocks * (blockIdx.y + heads * blockIdx.z);
  const int chunk = lin / (m_blocks * chunk_pairs);
  const int first = chunk * chunk_pairs;
  const int in_chunk = min(chunk_pairs, pairs - first);  // the last chunk may be smaller
  const int within = lin - chunk * m_blocks * chunk_pairs;
  const int pair = first + within % in_chunk;
  bc->m0 = (m_blocks - 1 - within / in_chunk) * T::BlockM;
  bc->head = pair % heads;
  bc->batch = pair / heads;
}

// ---------------------------------------------------------------------------------------------
// vl is read only by varlen instantiations (T::Varlen), var only by variant and cache ones
// (T::kVariant, T::kCache), kc only by cache ones.
//
// KV caches (T::kCache, the `_kvc` / `_kvc_pg<P>` configs): the queries are dense (FaParams'
// nq, strides and batch), FaParams' nk is the cache's capacity, and sequence b attends to
// its first min(kc.seqlens[b] + kc.added, nk) keys, read on the device (causal: bottom-right
// over its own length, as split-KV's cache kernels and FlashAttention-3 have it), from key
// kc.leftpad[b] on in a left-padded contiguous cache. Its keys are
// those of cache row kc.batch_idx[b] (b when null) of a contiguous cache, or of the pages its
// block-table row (the same row rule) lists; the K and V descriptors are over the cache as it
// is ([rows, capacity, kv_heads, D] or [pages, Page, kv_heads, D]).
template <class T>
__device__ __forceinline__ void fwd_body(const FaParams& p, const CUtensorMap* tq,
                                         const CUtensorMap* tk, const CUtensorMap* tv,
                                         const VarlenArgs& vl = VarlenArgs{},
                                         const FaVariant& var = FaVariant{},
                                         const FaKvCache& kc = FaKvCache{}) {
  using Elem = typename T::Elem;
  constexpr float kNegInf = -__builtin_huge_valf();
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t sbase = (raw + 1023u) & ~1023u;
  unsigned char* gbase = smem_raw + (sbase - raw);
  const Bars<T> bars{sbase + T::kBarOff};

  BlockCoord bc;
  if constexpr (T::LongestFirst) {
    block_coord_longest_first<T>(p, &bc);
  } else {
    // Causal blocks near the bottom do the most work: launch them first.
    const int m_block = T::Causal ? (gridDim.x - 1 - blockIdx.x) : blockIdx.x;
    bc.m0 = m_block * T::BlockM;
    bc.head = blockIdx.y;
    bc.batch = blockIdx.z;
  }
  bc.kv_head = bc.head / (p.q_heads / p.kv_heads);
  int q_start = 0;  // packed: the sequence's first row
  if constexpr (T::Varlen) {
    // The grid covers the longest sequence: blocks past this one's end have nothing to do
    // (before any barrier, so the whole block may leave).
    q_start = vl.cu_seqlens_q[bc.batch];
    const int k_start = vl.cu_seqlens_k[bc.batch];
    bc.nq = vl.cu_seqlens_q[bc.batch + 1] - q_start;
    bc.nk = vl.cu_seqlens_k[bc.batch + 1] - k_start;
    if (bc.m0 >= bc.nq) return;
    bc.q_row = q_start + bc.m0;
    bc.k_row = k_start;
  }
  const int32_t* table = nullptr;  // a paged cache: this sequence's block-table row
  int cache_row = 0;               // a contiguous cache: this sequence's cache row
  int first = 0;                   // ... and its first key (left padding before it)
  if constexpr (T::kCache) {
    const int length = max(0, min(kc.seqlens[bc.batch] + kc.added, p.nk));
    bc.nk = length;
    const int row = kc.batch_idx != nullptr ? kc.batch_idx[bc.batch] : bc.batch;
    if constexpr (T::kPage > 0) {
      table = kc.block_table + static_cast<int64_t>(row) * kc.table_stride;
    } else {
      cache_row = row;
      if (kc.leftpad != nullptr) first = min(max(kc.leftpad[bc.batch], 0), length);
      bc.nk = length - first;
    }
  }
  // Read where they are used, as the dense kernel always has (its code stays the same).
  auto len_q = [&]() { return T::Varlen ? bc.nq : p.nq; };
  auto len_k = [&]() { return T::kSeqK ? bc.nk : p.nk; };
  // The mask policy's n_block_max(m0 + BlockM, BlockN), spelled with this association so
  // that the shipped kernels' code stays the same (bench/ptx_identity.py).
  if constexpr (T::Local) {
    // A window or chunk: the key tiles [n_block_min(m0), n_block_max(m0 + BlockM)), so the
    // block's cost follows the keys its rows see (none: the empty range below).
    const fa::LocalMask mask = variant_mask<T>(len_q(), len_k(), var);
    bc.n_first = mask.n_block_min(bc.m0, T::BlockN);
    bc.n_tiles = max(0, mask.n_block_max(bc.m0 + T::BlockM, T::BlockN) - bc.n_first);
  } else {
    int key_end = len_k();
    if constexpr (T::Causal) key_end = min(len_k(), bc.m0 + T::BlockM + len_k() - len_q());
    bc.n_tiles = fa::key_tiles(key_end, T::BlockN);
  }

  const int tid = threadIdx.x;
  // Every row of this block sees no key: O = 0, LSE = -inf (with sinks: the head's sink
  // logit, the log of a denominator holding the sink alone).
  if (bc.n_tiles == 0) {
    const int q_rows = min(T::BlockM, len_q() - bc.m0);
    Elem* gO = static_cast<Elem*>(p.o) +
               (T::Varlen ? q_start * p.o_row_stride + bc.head * p.o_head_stride
                          : bc.batch * p.o_batch_stride + bc.head * p.o_head_stride) +
               static_cast<int64_t>(bc.m0) * p.o_row_stride;
    constexpr int kChunks = T::D / 8;
    for (int idx = tid; idx < q_rows * kChunks; idx += T::kThreads) {
      const int r = idx / kChunks, c = idx % kChunks;
      *reinterpret_cast<uint4*>(gO + r * p.o_row_stride + c * 8) = make_uint4(0, 0, 0, 0);
    }
    if (p.lse != nullptr) {
      float* lse =
          p.lse +
          (T::Varlen ? static_cast<int64_t>(bc.head) * vl.total_q + q_start
                     : (static_cast<int64_t>(bc.batch) * p.q_heads + bc.head) * p.nq) +
          bc.m0;
      float empty_lse = kNegInf;
      if constexpr (T::Sinks) {
        if (var.sinks != nullptr) empty_lse = var.sinks[bc.head];
      }
      for (int r = tid; r < q_rows; r += T::kThreads) lse[r] = empty_lse;
    }
    return;
  }

  if (tid == 0) {
    mbar_init(bars.q_full(), 1);
#pragma unroll
    for (int s = 0; s < T::Stages; ++s) {
      mbar_init(bars.k_full(s), 1);
      mbar_init(bars.v_full(s), 1);
      mbar_init(bars.k_empty(s), 4 * T::kConsumerWGs);  // one arrive per consumer warp
      mbar_init(bars.v_empty(s), 4 * T::kConsumerWGs);
    }
    mbar_fence_init();
  }
  __syncthreads();

  const int wg = tid / 128;
  if (wg == 0) {
    if constexpr (T::kSplitRegs) reg_dealloc<T::kProducerRegs>();
    if (tid == 0) producer<T>(bc, sbase, bars, tq, tk, tv, table, cache_row, first);
  } else {
    if constexpr (T::kSplitRegs) reg_alloc<T::ConsumerRegs>();
    consumer<T>(p, bc, sbase, gbase, bars, wg - 1, vl, var);
  }
}

}  // namespace fa3

// One extern "C" kernel per config, named by the config, for loading from a cubin.
// Launch: grid (ceil(nq / BlockM), q_heads, batch), block (BlockM / 64 + 1) * 128 threads,
// dynamic shared memory NAME_traits::kSmemBytes (see docs/fa3_kernel.md).
#define FA3_DEFINE_KERNEL(NAME, D, ELEM, CAUSAL, BLOCK_M, BLOCK_N, STAGES, PV_FROM_REGS,      \
                          INTRA_OVERLAP, PING_PONG, CONSUMER_REGS)                            \
  FA3_DEFINE_DENSE_KERNEL_(NAME, fa3::Traits<D, ELEM, CAUSAL, BLOCK_M, BLOCK_N, STAGES,       \
                                             PV_FROM_REGS, INTRA_OVERLAP, PING_PONG,          \
                                             CONSUMER_REGS>)

// The same for an `_lf` config: causal blocks launched longest first across heads.
#define FA3_DEFINE_LONGEST_FIRST_KERNEL(NAME, D, ELEM, CAUSAL, BLOCK_M, BLOCK_N, STAGES,      \
                                        PV_FROM_REGS, INTRA_OVERLAP, PING_PONG, CONSUMER_REGS) \
  FA3_DEFINE_DENSE_KERNEL_(NAME, fa3::Traits<D, ELEM, CAUSAL, BLOCK_M, BLOCK_N, STAGES,       \
                                             PV_FROM_REGS, INTRA_OVERLAP, PING_PONG,          \
                                             CONSUMER_REGS, false, true>)

// The dense kernel of one Traits type (variadic: the type's template arguments hold commas).
#define FA3_DEFINE_DENSE_KERNEL_(NAME, ...)                                                   \
  using NAME##_traits = __VA_ARGS__;                                                          \
  extern "C" __global__ void __launch_bounds__(NAME##_traits::kThreads, 1)                   \
      NAME(const FaParams p, const __grid_constant__ CUtensorMap tma_q,                      \
           const __grid_constant__ CUtensorMap tma_k, const __grid_constant__ CUtensorMap tma_v) { \
    fa3::fwd_body<NAME##_traits>(p, &tma_q, &tma_k, &tma_v);                                  \
  }

// The packed variable-length kernel of a `_vl` config: FaVarlen's bytes after FaParams, then
// the three descriptors (over the packed [total, heads, D] tensors). Launch: grid
// (ceil(longest nq / BlockM), q_heads, sequences); more sequences than 65,535 are launched in
// slices, each with the offsets' pointers advanced to its first sequence.
#define FA3_DEFINE_VARLEN_KERNEL(NAME, D, ELEM, CAUSAL, BLOCK_M, BLOCK_N, STAGES, PV_FROM_REGS, \
                                 INTRA_OVERLAP, PING_PONG, CONSUMER_REGS)                      \
  using NAME##_traits = fa3::Traits<D, ELEM, CAUSAL, BLOCK_M, BLOCK_N, STAGES, PV_FROM_REGS,    \
                                    INTRA_OVERLAP, PING_PONG, CONSUMER_REGS, true>;             \
  extern "C" __global__ void __launch_bounds__(NAME##_traits::kThreads, 1)                     \
      NAME(const FaParams p, const fa3::VarlenArgs vl,                                         \
           const __grid_constant__ CUtensorMap tma_q, const __grid_constant__ CUtensorMap tma_k, \
           const __grid_constant__ CUtensorMap tma_v) {                                         \
    fa3::fwd_body<NAME##_traits>(p, &tma_q, &tma_k, &tma_v, vl);                                \
  }

// The kernel of a config with an attention-variant switch (`_loc`, `_cap`, `_snk`): every
// Traits argument in order, the switches last, and the plain kernel's arguments (dense or
// varlen, by VARLEN) followed by FaVariant. VARLEN is spelled `true` or `false` (the rendered
// instantiation's text): it picks the signature by name.
#define FA3_DEFINE_VARIANT_KERNEL(NAME, D, ELEM, CAUSAL, BLOCK_M, BLOCK_N, STAGES, PV_FROM_REGS, \
                                  INTRA_OVERLAP, PING_PONG, CONSUMER_REGS, VARLEN,              \
                                  LONGEST_FIRST, LOCAL, SOFTCAP, SINKS)                         \
  using NAME##_traits =                                                                          \
      fa3::Traits<D, ELEM, CAUSAL, BLOCK_M, BLOCK_N, STAGES, PV_FROM_REGS, INTRA_OVERLAP,        \
                  PING_PONG, CONSUMER_REGS, VARLEN, LONGEST_FIRST, LOCAL, SOFTCAP, SINKS>;        \
  static_assert(NAME##_traits::kVariant, "a plain config: FA3_DEFINE_KERNEL");                  \
  FA3_VARIANT_KERNEL_##VARLEN##_(NAME)

// The kernel of a KV-cache config (`_kvc`, `_kvc_pg<P>`; fwd_body's "KV caches"): every
// Traits argument in order, the variant switches, then the page size (0: a contiguous cache);
// the kernel takes FaVariant and FaKvCache after the descriptors, and NAME_append
// (kv_append.cuh) writes a call's new rows into the cache before it. Launch: the dense grid
// over FaParams' nq; the K and V descriptors' boxes are kKVBoxRows rows.
#define FA3_DEFINE_CACHE_KERNEL(NAME, D, ELEM, CAUSAL, BLOCK_M, BLOCK_N, STAGES, PV_FROM_REGS,  \
                                INTRA_OVERLAP, PING_PONG, CONSUMER_REGS, VARLEN, LONGEST_FIRST, \
                                LOCAL, SOFTCAP, SINKS, PAGE)                                    \
  using NAME##_traits =                                                                          \
      fa3::Traits<D, ELEM, CAUSAL, BLOCK_M, BLOCK_N, STAGES, PV_FROM_REGS, INTRA_OVERLAP,        \
                  PING_PONG, CONSUMER_REGS, VARLEN, LONGEST_FIRST, LOCAL, SOFTCAP, SINKS, PAGE>;  \
  static_assert(NAME##_traits::kCache, "a cache config has a page size of 0 or more");          \
  extern "C" __global__ void __launch_bounds__(NAME##_traits::kThreads, 1)                      \
      NAME(const FaParams p, const __grid_constant__ CUtensorMap tma_q,                         \
           const __grid_constant__ CUtensorMap tma_k, const __grid_constant__ CUtensorMap tma_v, \
           const FaVariant var, const FaKvCache kc) {                                            \
    fa3::fwd_body<NAME##_traits>(p, &tma_q, &tma_k, &tma_v, fa3::VarlenArgs{}, var, kc);        \
  }                                                                                              \
  KVCACHE_DEFINE_APPEND_KERNEL(NAME)

#define FA3_VARIANT_KERNEL_false_(NAME)                                                          \
  extern "C" __global__ void __launch_bounds__(NAME##_traits::kThreads, 1)                      \
      NAME(const FaParams p, const __grid_constant__ CUtensorMap tma_q,                         \
           const __grid_constant__ CUtensorMap tma_k, const __grid_constant__ CUtensorMap tma_v, \
           const FaVariant var) {                                                                \
    fa3::fwd_body<NAME##_traits>(p, &tma_q, &tma_k, &tma_v, fa3::VarlenArgs{}, var);            \
  }

#define FA3_VARIANT_KERNEL_true_(NAME)                                                           \
  extern "C" __global__ void __launch_bounds__(NAME##_traits::kThreads, 1)                      \
      NAME(const FaParams p, const fa3::VarlenArgs vl,                                           \
           const __grid_constant__ CUtensorMap tma_q, const __grid_constant__ CUtensorMap tma_k, \
           const __grid_constant__ CUtensorMap tma_v, const FaVariant var) {                    \
    fa3::fwd_body<NAME##_traits>(p, &tma_q, &tma_k, &tma_v, vl, var);                            \
  }
