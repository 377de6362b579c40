// fa2tune: the attention-variant rule of the exported header's dispatch: a call's variant in
// the one normal form, and which tuned variant entry answers it.
//
// The C++ twin of core/variant.py (normalize), fa2tune/ops/choice.py (normalize_call, for a
// packed batch) and core/lookup.py (variant_distance, and pick's variant and shape steps): the
// store, the service, the PyTorch op and the header must answer a variant call with the same
// tuned entry, so every step below mirrors the Python one, in the same order and, for the
// window distance, in double precision with the same libm log2, summed in the same order.
// tests/codegen/test_export_variants.py builds this file on its own and holds it to Python's
// answers.
//
// Host-only, plain C++17 (no CUDA): the dispatch runs on the host, and a test can build it
// with any C++ compiler.
#pragma once

#include <cmath>

#include "fa_shape.cuh"

namespace fa2tune_variant {

// A length the caller does not know (core.variant.normalize's None).
inline constexpr long long kUnknown = -1;

// A call's variant in the store's form, with the mask it is served as: what the dispatch
// keys its tables by (mask and switches) and compares entries with (window and chunk). The
// cap's value and the sink logits are run-time values of the kernel, not part of the key.
struct Normal {
  bool causal;
  int window_left;   // -1: no bound
  int window_right;  // -1: no bound
  int chunk;         // 0: none
  bool softcap;      // the softcap switch: a cap above 0
  bool sinks;        // the sinks switch: sink logits given

  bool local() const { return window_left >= 0 || window_right >= 0 || chunk > 0; }
  bool plain() const { return !local() && !softcap && !sinks; }
};

// core.variant.normalize with the call's lengths (kUnknown: not known, as for a packed batch
// without them): a bound reaching past every key is none, a chunk holding every key of a
// call whose queries all have a key position is none, a right bound 0 is causality, one
// query row with a window or a chunk is unmasked (core.shape.effective_causal; other calls
// keep their mask, which the lookup serves as effective_causal says), a causal call's right
// bound is 0 and plain causal is no window. The arguments are valid (bounds >= -1, chunk >= 0).
inline Normal normalize(bool causal, int left, int right, int chunk, bool softcap, bool sinks,
                        long long nq, long long nk) {
  if (nk != kUnknown && left >= nk - 1) left = -1;
  if (nq != kUnknown && right >= nq - 1) right = -1;
  if (nq != kUnknown && nk != kUnknown && chunk >= nk && nk >= nq) chunk = 0;
  if (right == 0) causal = true;  // a right bound 0 is causality, with or without a left bound
  if (nq != kUnknown && (left >= 0 || chunk > 0)) causal = causal && nq != 1;  // decode: unmasked
  if (causal) right = 0;
  if (causal && left < 0 && chunk == 0) right = -1;  // plain causal: no window
  return {causal, left, right, chunk, softcap, sinks};
}

// A packed batch's form, as fa2tune.torch decides it (fa2tune.ops.choice.normalize_call with
// the longest lengths, then effective_varlen_causal): the window rules hold for the longest
// sequence as for every one; a chunk that reaches past the longest key sequence is kept (the
// longest lengths do not say that every sequence has as many keys as queries), and the batch
// is served unmasked when its longest query sequence has one row.
inline Normal normalize_packed(bool causal, int left, int right, int chunk, bool softcap,
                               bool sinks, long long max_q, long long max_k) {
  long long nq = max_q;
  if (chunk > 0 && chunk >= max_k && nq < max_k + 1) nq = max_k + 1;
  Normal n = normalize(causal, left, right, chunk, softcap, sinks, nq, max_k);
  n.causal = n.causal && (max_q > 1 ? max_q : 1) != 1;
  return n;
}

// core.lookup.variant_distance: how far a stored window and chunk are from the asked ones,
// compared as a key: first the count of bounds one side has and the other has not, then the
// sum of |log2| of the ratios of the others (window bounds counted from 1).
struct Distance {
  int apart;
  double logs;
};

inline bool operator==(const Distance& a, const Distance& b) {
  return a.apart == b.apart && a.logs == b.logs;
}

inline bool operator<(const Distance& a, const Distance& b) {
  return a.apart != b.apart ? a.apart < b.apart : a.logs < b.logs;
}

// One bound's (or the chunk's) term: core.lookup._bound_term.
inline Distance bound_term(int asked, int stored, int none, int shift) {
  if (asked == stored) return {0, 0.0};
  if (asked == none || stored == none) return {1, 0.0};
  const double ratio = static_cast<double>(asked + shift) / static_cast<double>(stored + shift);
  return {0, std::fabs(std::log2(ratio))};
}

inline Distance distance(const Normal& asked, int window_left, int window_right, int chunk) {
  const Distance l = bound_term(asked.window_left, window_left, -1, 1);
  const Distance r = bound_term(asked.window_right, window_right, -1, 1);
  const Distance c = bound_term(asked.chunk, chunk, 0, 0);
  return {l.apart + r.apart + c.apart, ((0.0 + l.logs) + r.logs) + c.logs};
}

inline bool same_shape(const fa2tune_shape::Shape& a, const fa2tune_shape::Shape& b) {
  return a.nq == b.nq && a.nk == b.nk && a.batch == b.batch && a.heads == b.heads &&
         a.kv_heads == b.kv_heads;
}

// Python's order of core.shape.Shape (its fields in turn): the dense tie-break after
// nearest_key.
inline bool shape_before(const fa2tune_shape::Shape& a, const fa2tune_shape::Shape& b) {
  if (a.nq != b.nq) return a.nq < b.nq;
  if (a.nk != b.nk) return a.nk < b.nk;
  if (a.batch != b.batch) return a.batch < b.batch;
  if (a.heads != b.heads) return a.heads < b.heads;
  return a.kv_heads < b.kv_heads;
}

// What pick found: the entry, its shape distance from the asked shape, and whether its window
// and chunk are the asked ones.
struct Found {
  int index;  // -1: none
  double distance;
  bool same_variant;
};

// core.lookup.pick among the entries of one (D, dtype, mask, switches) table, for a dense
// shape (packed false) or a packed batch known by its count and mean (packed true; never an
// exact match of a tuned batch, whose lengths the header does not keep). An entry has
// `shape`, `window_left`, `window_right`, `chunk` and `rank` (the order of the store's rank:
// throughput for dense problems, the first tuned for packed ones); accepts(i) leaves entries
// out (the dispatch passes over configs that cannot run here; the device-free lookups keep
// every one).
//
// The rule: among the entries of a dense call's phase (fa2tune_shape::same_phase), those
// whose window and chunk are nearest to the asked ones (the same when tuned), then a dense entry at the asked shape (the best rank among them), else the entry
// nearest to the asked shape by fa2tune_shape::nearer, ties to the lower shape (dense) or
// the better rank (packed); among the dense entries of that shape, the best rank.
template <class Entry, class Accepts>
inline Found pick(const Entry* entries, int count, const fa2tune_shape::Shape& asked,
                  const Normal& v, int sm_count, bool packed, Accepts&& accepts_here) {
  // A dense call's entries of the other phase (decode / prefill) never answer, as in
  // core.lookup.pick; a packed batch's are all compared.
  auto accepts = [&](int i) {
    return accepts_here(i) && (packed || fa2tune_shape::same_phase(asked, entries[i].shape));
  };
  int any = -1;
  Distance closest{0, 0.0};
  for (int i = 0; i < count; ++i) {
    if (!accepts(i)) continue;
    const Entry& e = entries[i];
    const Distance d = distance(v, e.window_left, e.window_right, e.chunk);
    if (any < 0 || d < closest) closest = d;
    any = i;
  }
  if (any < 0) return {-1, 0.0, false};
  const bool same = closest == Distance{0, 0.0};
  auto kept = [&](int i) {
    const Entry& e = entries[i];
    return accepts(i) && distance(v, e.window_left, e.window_right, e.chunk) == closest;
  };
  if (!packed) {
    int hit = -1;
    for (int i = 0; i < count; ++i)
      if (kept(i) && same_shape(entries[i].shape, asked) &&
          (hit < 0 || entries[i].rank < entries[hit].rank))
        hit = i;
    if (hit >= 0) return {hit, 0.0, same};
  }
  int first = -1;
  double first_distance = 0.0;
  for (int i = 0; i < count; ++i) {
    if (!kept(i)) continue;
    const fa2tune_shape::Shape& s = entries[i].shape;
    const double d = fa2tune_shape::distance(asked, s, sm_count);
    bool better = first < 0;
    if (!better) {
      const fa2tune_shape::Shape& f = entries[first].shape;
      if (fa2tune_shape::nearer(s, d, f, first_distance))
        better = true;
      else if (!fa2tune_shape::nearer(f, first_distance, s, d))  // tied on nearest_key
        better = packed ? entries[i].rank < entries[first].rank : shape_before(s, f);
    }
    if (better) {
      first = i;
      first_distance = d;
    }
  }
  int best = first;
  if (!packed)
    for (int i = 0; i < count; ++i)
      if (kept(i) && same_shape(entries[i].shape, entries[first].shape) &&
          entries[i].rank < entries[best].rank)
        best = i;
  return {best, first_distance, same};
}

}  // namespace fa2tune_variant
