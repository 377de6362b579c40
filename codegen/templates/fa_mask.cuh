// fa2tune: mask and score policies, the attention variant of a kernel as small types.
//
// A mask policy says, for one query tile, which key tiles it visits and, inside a tile that
// straddles the boundary, which keys each query row sees. Every family's kernel asks it:
//
//   n_block_min(q_first, bn)  the first key tile (of bn keys) rows from q_first on visit
//   n_block_max(q_end, bn)    one past the last key tile rows below q_end visit (0: none);
//                             key_end(q_end) is that bound in keys
//   edge_key(q_first)         the last key every row from q_first on sees: a tile of keys
//                             [n0, n0 + bn) needs the element mask iff n0 + bn - 1 > edge_key
//                             or n0 + bn > nk (the sequence's tail, the same for every policy)
//   key_begin(row), key_limit(row)
//                             the element mask: query `row` sees keys [key_begin, key_limit)
//
// Rows and keys are indices within one sequence (nq query rows, nk keys). The policies so far:
//   NoMask       every row sees all nk keys;
//   CausalMask   bottom-right aligned: query i sees key j iff j <= i + nk - nq (FlashAttention-2's
//                rule). A row that sees no key gets O = 0 and LSE = -inf (the kernels' rule).
// A sliding window or a chunk bound is one more policy: a key_begin and n_block_min above 0, a
// key_limit that also depends on the window. (The kernels' key loops start at tile 0 today,
// the n_block_min of both policies, and mask keys >= key_limit only; such a policy makes them
// start at n_block_min and mask keys < key_begin too.)
//
// The questions return ints, and the kernels compare them with the tile's bounds themselves:
// the shipped kernels' PTX stays byte for byte what it was before the policies
// (bench/ptx_identity.py), which bool-valued helpers did not keep.
//
// A score policy transforms a tile of S = Q K^T (raw, before the softmax scale) in place after
// the GEMM and before the mask; ScoreIdentity leaves it as it is. A softcap (cap * tanh(s / cap))
// or sink logits are each one more policy.
//
// Everything here is __host__ __device__, so a host program checks the rules against a
// reference (tests/codegen/test_kernel_policies.py).
#pragma once

#if defined(__CUDACC__)
#define FA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FA_HOST_DEVICE inline
#endif

namespace fa {

// CUDA's min where nvcc compiles (the kernels always wrote it so); plain C++ elsewhere.
#if defined(__CUDACC__)
FA_HOST_DEVICE int imin(int a, int b) { return min(a, b); }
#else
inline int imin(int a, int b) { return a < b ? a : b; }
#endif

constexpr int kNoEdge = 2147483647;  // edge_key of a policy without one: no tile crosses it

// Tiles of bn keys that cover keys [0, key_end).
FA_HOST_DEVICE int key_tiles(int key_end, int bn) { return key_end > 0 ? (key_end + bn - 1) / bn : 0; }

struct NoMask {
  static constexpr bool kCausal = false;
  int nk, diag;  // diag = nk - nq
  FA_HOST_DEVICE NoMask(int nq, int nk_) : nk(nk_), diag(nk_ - nq) {}
  // The same policy from nk and diag (a kernel re-reading nk where it uses it).
  static FA_HOST_DEVICE NoMask of_diag(int nk_, int diag_) { return NoMask(nk_ - diag_, nk_); }
  FA_HOST_DEVICE int key_end(int q_end) const {
    (void)q_end;
    return nk;
  }
  FA_HOST_DEVICE int n_block_min(int q_first, int bn) const {
    (void)q_first, (void)bn;
    return 0;
  }
  FA_HOST_DEVICE int n_block_max(int q_end, int bn) const { return key_tiles(key_end(q_end), bn); }
  FA_HOST_DEVICE int edge_key(int q_first) const {
    (void)q_first;
    return kNoEdge;
  }
  FA_HOST_DEVICE int key_begin(int row) const {
    (void)row;
    return 0;
  }
  FA_HOST_DEVICE int key_limit(int row) const {
    (void)row;
    return nk;
  }
};

struct CausalMask {
  static constexpr bool kCausal = true;
  int nk, diag;  // query i sees keys j <= i + diag
  FA_HOST_DEVICE CausalMask(int nq, int nk_) : nk(nk_), diag(nk_ - nq) {}
  // The same policy from nk and diag (a kernel re-reading nk where it uses it).
  static FA_HOST_DEVICE CausalMask of_diag(int nk_, int diag_) { return CausalMask(nk_ - diag_, nk_); }
  FA_HOST_DEVICE int key_end(int q_end) const { return imin(nk, q_end + diag); }
  FA_HOST_DEVICE int n_block_min(int q_first, int bn) const {
    (void)q_first, (void)bn;
    return 0;
  }
  FA_HOST_DEVICE int n_block_max(int q_end, int bn) const { return key_tiles(key_end(q_end), bn); }
  FA_HOST_DEVICE int edge_key(int q_first) const { return q_first + diag; }
  FA_HOST_DEVICE int key_begin(int row) const {
    (void)row;
    return 0;
  }
  FA_HOST_DEVICE int key_limit(int row) const { return imin(nk, row + diag + 1); }
};

// The policy of a kernel's compile-time Causal switch.
template <bool Causal>
struct MaskOf {
  using type = NoMask;
};
template <>
struct MaskOf<true> {
  using type = CausalMask;
};
template <bool Causal>
using MaskFor = typename MaskOf<Causal>::type;

struct ScoreIdentity {
  // s: the thread's scores of one tile (any fragment layout); left as they are.
  template <class Scores>
  FA_HOST_DEVICE static void apply(Scores& s) {
    (void)s;
  }
};

}  // namespace fa
