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
//   LocalMask    FlashAttention's local attention, bottom-right aligned like causal: with
//                pos = i + nk - nq, query i sees key j iff pos - left <= j <= pos + right
//                (a bound of -1 is none; causal is right = 0) and, with a chunk c > 0, j lies
//                in pos's chunk [pos - pos mod c, pos - pos mod c + c) (mod rounding down).
//                Its key_begin is above 0, so its n_block_min is too: the key loops start
//                there and a call's cost follows the keys it sees, not nk.
// A policy with kLeftBound also masks keys below key_begin: a tile [n0, n0 + bn) of a query
// tile whose last row is q_last needs the element mask when n0 < begin_edge(q_last) too.
// Every policy answers those questions from (nq, nk) and the run-time window (left, right,
// chunk); the plain ones ignore the window, and their kLeftBound is false, so a kernel asks
// `if constexpr (Mask::kLeftBound)` and plain kernels keep their code.
//
// The questions return ints, and the kernels compare them with the tile's bounds themselves:
// the shipped kernels' PTX stays byte for byte what it was before the policies
// (bench/ptx_identity.py), which bool-valued helpers did not keep.
//
// A score policy transforms a tile of S = Q K^T (raw, before the softmax scale) in place after
// the GEMM and before the mask, and says by what the softmax then scales what it left:
//   ScoreIdentity  leaves S; the softmax scale is FaParams' softmax_scale;
//   SoftcapScore   Gemma-2's logit softcap: scores scale * s become cap * tanh(scale * s / cap);
//                  it stores tanh(s * scale / cap) and the softmax scale becomes cap (one
//                  multiply per score fewer than storing cap * tanh).
// Attention sinks (a per-head logit that joins every row's softmax denominator and attends to
// nothing) need no score policy: a kernel starts each row's running max at the sink's logit
// in the softmax's units (sink_row_max) and its running sum at 1 (one thread of the quad), so
// the online softmax and LSE carry the sink like one more key whose value row is zero.
//
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
  static constexpr bool kLeftBound = false;
  FA_HOST_DEVICE NoMask(int nq, int nk_) : nk(nk_), diag(nk_ - nq) {}
  FA_HOST_DEVICE NoMask(int nq, int nk_, int left, int right, int chunk) : NoMask(nq, nk_) {
    (void)left, (void)right, (void)chunk;
  }
  // The same policy from nk and diag (a kernel re-reading nk where it uses it).
  static FA_HOST_DEVICE NoMask of_diag(int nk_, int diag_) { return NoMask(nk_ - diag_, nk_); }
  FA_HOST_DEVICE NoMask again(int nk_, int diag_) const { return of_diag(nk_, diag_); }
  FA_HOST_DEVICE int begin_edge(int q_last) const {
    (void)q_last;
    return 0;
  }
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
  static constexpr bool kLeftBound = false;
  FA_HOST_DEVICE CausalMask(int nq, int nk_) : nk(nk_), diag(nk_ - nq) {}
  FA_HOST_DEVICE CausalMask(int nq, int nk_, int left, int right, int chunk)
      : CausalMask(nq, nk_) {
    (void)left, (void)right, (void)chunk;
  }
  // The same policy from nk and diag (a kernel re-reading nk where it uses it).
  static FA_HOST_DEVICE CausalMask of_diag(int nk_, int diag_) { return CausalMask(nk_ - diag_, nk_); }
  FA_HOST_DEVICE CausalMask again(int nk_, int diag_) const { return of_diag(nk_, diag_); }
  FA_HOST_DEVICE int begin_edge(int q_last) const {
    (void)q_last;
    return 0;
  }
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

// Every policy also takes the run-time window (left, right, chunk); the plain ones ignore it.
// A bound of -1 is none; chunk 0 is none.
FA_HOST_DEVICE int imax(int a, int b) { return a > b ? a : b; }

// Rounds x down to a multiple of c > 0, for negative x too (C++'s % truncates toward zero).
FA_HOST_DEVICE int floor_multiple(int x, int c) {
  const int r = x % c;
  return x - (r < 0 ? r + c : r);
}

struct LocalMask {
  static constexpr bool kCausal = false;  // the launch order is the config's Causal switch
  static constexpr bool kLeftBound = true;
  int nk, diag;             // pos = i + diag is query i's own key position
  int left, right, chunk;   // -1: no bound; chunk 0: none
  FA_HOST_DEVICE LocalMask(int nq, int nk_, int left_, int right_, int chunk_)
      : nk(nk_), diag(nk_ - nq), left(left_), right(right_), chunk(chunk_) {}
  FA_HOST_DEVICE LocalMask again(int nk_, int diag_) const {
    return LocalMask(nk_ - diag_, nk_, left, right, chunk);
  }
  // The first key position row `row` sees, before clamping to [0, nk).
  FA_HOST_DEVICE int begin_at(int row) const {
    const int pos = row + diag;
    int b = left >= 0 ? pos - left : 0;
    if (chunk > 0) b = imax(b, floor_multiple(pos, chunk));
    return b;
  }
  // One past the last key position row `row` sees, before clamping to nk.
  FA_HOST_DEVICE int limit_at(int row) const {
    const int pos = row + diag;
    int l = right >= 0 ? pos + right + 1 : nk;
    if (chunk > 0) l = imin(l, floor_multiple(pos, chunk) + chunk);
    return l;
  }
  FA_HOST_DEVICE int key_begin(int row) const { return imin(nk, imax(0, begin_at(row))); }
  FA_HOST_DEVICE int key_limit(int row) const { return imax(0, imin(nk, limit_at(row))); }
  // Both bounds grow with the row, so a tile's rows see keys within
  // [key_begin(first row), key_limit(last row)).
  FA_HOST_DEVICE int key_end(int q_end) const { return key_limit(q_end - 1); }
  FA_HOST_DEVICE int n_block_min(int q_first, int bn) const { return key_begin(q_first) / bn; }
  FA_HOST_DEVICE int n_block_max(int q_end, int bn) const { return key_tiles(key_end(q_end), bn); }
  // The last key every row from q_first on sees on the right (the first row's limit).
  FA_HOST_DEVICE int edge_key(int q_first) const { return limit_at(q_first) - 1; }
  // The first key every row up to q_last sees on the left (the last row's begin).
  FA_HOST_DEVICE int begin_edge(int q_last) const { return begin_at(q_last); }
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

// The policy of a kernel's compile-time (Causal, Local) switches: a local kernel's window
// carries causality (right = 0), so Local picks LocalMask whatever Causal says.
template <bool Causal, bool Local>
struct VariantMaskOf {
  using type = MaskFor<Causal>;
};
template <bool Causal>
struct VariantMaskOf<Causal, true> {
  using type = LocalMask;
};
template <bool Causal, bool Local>
using VariantMask = typename VariantMaskOf<Causal, Local>::type;

// Applies f to every float of a score fragment of any nesting of C arrays.
template <class F>
FA_HOST_DEVICE void each_score(float& x, const F& f) {
  x = f(x);
}
template <class T, int N, class F>
FA_HOST_DEVICE void each_score(T (&a)[N], const F& f) {
#pragma unroll
  for (int i = 0; i < N; ++i) each_score(a[i], f);
}

FA_HOST_DEVICE float tanh_fast(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return __builtin_tanhf(x);
#endif
}

struct ScoreIdentity {
  static constexpr bool kSoftcap = false;
  FA_HOST_DEVICE ScoreIdentity() {}
  FA_HOST_DEVICE ScoreIdentity(float softmax_scale, float cap) {
    (void)softmax_scale, (void)cap;
  }
  // s: the thread's scores of one tile (any fragment layout); left as they are.
  template <class Scores>
  FA_HOST_DEVICE static void apply(Scores& s) {
    (void)s;
  }
  // The scale the softmax applies to what apply() left (natural-log units per unit).
  FA_HOST_DEVICE static float softmax_scale(float params_scale) { return params_scale; }
};

struct SoftcapScore {
  static constexpr bool kSoftcap = true;
  float pre;  // softmax_scale / cap
  float cap;
  FA_HOST_DEVICE SoftcapScore(float softmax_scale, float cap_)
      : pre(softmax_scale / cap_), cap(cap_) {}
  FA_HOST_DEVICE float operator()(float s) const { return tanh_fast(s * pre); }
  template <class Scores>
  FA_HOST_DEVICE void apply(Scores& s) const {
    each_score(s, *this);
  }
  FA_HOST_DEVICE float softmax_scale(float params_scale) const {
    (void)params_scale;
    return cap;
  }
};

template <bool Softcap>
struct ScoreOf {
  using type = ScoreIdentity;
};
template <>
struct ScoreOf<true> {
  using type = SoftcapScore;
};
template <bool Softcap>
using ScoreFor = typename ScoreOf<Softcap>::type;

// A sink's logit (natural-log units, as the model learns it) as a running row max in the
// units of what the score policy left: the softmax multiplies that max by its scale.
FA_HOST_DEVICE float sink_row_max(float sink_logit, float softmax_scale) {
  return sink_logit / softmax_scale;
}

}  // namespace fa
