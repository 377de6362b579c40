// fa2tune: the distance between attention call shapes that picks the nearest tuned shape.
//
// The C++ twin of core/shape.py (shape_distance, nearest_key, nearest_shape): the store, the
// service and the exported header must pick the same tuned shape for a call, so every step
// below mirrors the Python one operation for operation, in double precision (the same
// correctly rounded quotients and the same libm log, summed in the same order).
// tests/test_export_shapes.py compiles this file on its own and holds it to Python's answers.
//
// Host-only, plain C++17 (no CUDA): the dispatch runs on the host, and a test can build it
// with any C++ compiler.
#pragma once

#include <cmath>
#include <cstdint>

namespace fa2tune_shape {

// Query rows of the nominal block the grid-fill term counts (core.shape.NOMINAL_BLOCK_ROWS).
inline constexpr long long kNominalBlockRows = 128;
// Grid fills at or above this many waves count as equal (core.shape.MAX_WAVES).
inline constexpr long long kMaxWaves = 8;
// Query rows up to which a call is a decode step (core.shape.DECODE_MAX_NQ).
inline constexpr long long kDecodeMaxNq = 16;

// One call's shape; every field >= 1 and heads a multiple of kv_heads (as core.shape.Shape).
struct Shape {
  long long nq;
  long long nk;
  long long batch;
  long long heads;
  long long kv_heads;
};

// core.shape.grid_fill: waves of nominal query blocks on sm_count SMs, clamped to
// [1/SMs, kMaxWaves]. Python counts the blocks in exact integers; here the product is cut
// short once it reaches the clamp, so it never overflows and what remains (< 8 * SMs) is
// exact in a double, making blocks / SMs the same correctly rounded quotient.
inline double grid_fill(const Shape& s, int sm_count) {
  const long long sms = sm_count > 1 ? sm_count : 1;
  const long long cap = kMaxWaves * sms;
  long long blocks = (s.nq + kNominalBlockRows - 1) / kNominalBlockRows;
  if (blocks >= cap) return static_cast<double>(kMaxWaves);
  blocks *= s.heads;  // < cap * 2^31: no overflow
  if (blocks >= cap) return static_cast<double>(kMaxWaves);
  blocks *= s.batch;
  if (blocks >= cap) return static_cast<double>(kMaxWaves);
  const double fill = static_cast<double>(blocks) / static_cast<double>(sms);
  const double least = 1.0 / static_cast<double>(sms);
  return fill > least ? fill : least;  // blocks >= 1, so never below: kept for the twin
}

// core.shape.same_phase: a tuned shape answers only calls of its own phase, decode steps
// (nq <= kDecodeMaxNq) or prefill; nearest() and fa_variant.cuh's pick leave out the rest.
inline bool same_phase(const Shape& asked, const Shape& tuned) {
  return (asked.nq <= kDecodeMaxNq) == (tuned.nq <= kDecodeMaxNq);
}

// core.shape.shape_distance: |ln| of the Nq, Nk, grid-fill and GQA-group ratios, summed in
// that order (0 for the same shape).
inline double distance(const Shape& asked, const Shape& tuned, int sm_count) {
  const double group_asked = static_cast<double>(asked.heads / asked.kv_heads);
  const double group_tuned = static_cast<double>(tuned.heads / tuned.kv_heads);
  double d = std::fabs(std::log(static_cast<double>(asked.nq) / static_cast<double>(tuned.nq)));
  d += std::fabs(std::log(static_cast<double>(asked.nk) / static_cast<double>(tuned.nk)));
  d += std::fabs(std::log(grid_fill(asked, sm_count) / grid_fill(tuned, sm_count)));
  d += std::fabs(std::log(group_asked / group_tuned));
  return d;
}

// Whether tuned shape a (at distance da) sorts before b (at db) under core.shape.nearest_key:
// the smaller distance, then the larger nq, nk and batch * heads, then the fewer KV heads.
inline bool nearer(const Shape& a, double da, const Shape& b, double db) {
  if (da != db) return da < db;
  if (a.nq != b.nq) return a.nq > b.nq;
  if (a.nk != b.nk) return a.nk > b.nk;
  if (a.batch * a.heads != b.batch * b.heads) return a.batch * a.heads > b.batch * b.heads;
  return a.kv_heads < b.kv_heads;
}

// core.shape.nearest_shape over entries 0..count-1: the index of the nearest of the asked
// call's phase (of any phase when phased is false: packed batches), -1 when none.
// shape_at(i) returns entry i's tuned shape, or nullptr to leave the entry out (the dispatch
// leaves out configs that cannot run here). Entries tied on the whole key go to the earlier
// one, as Python's min() does over the same list. *distance_out gets the winner's distance.
template <class ShapeAt>
inline int nearest(const Shape& asked, int count, int sm_count, ShapeAt&& shape_at,
                   double* distance_out = nullptr, bool phased = true) {
  int best = -1;
  Shape best_shape{};
  double best_distance = 0.0;
  for (int i = 0; i < count; ++i) {
    const Shape* s = shape_at(i);
    if (s == nullptr || (phased && !same_phase(asked, *s))) continue;
    const double d = distance(asked, *s, sm_count);
    if (best < 0 || nearer(*s, d, best_shape, best_distance)) {
      best = i;
      best_shape = *s;
      best_distance = d;
    }
  }
  if (distance_out != nullptr && best >= 0) *distance_out = best_distance;
  return best;
}

// core.shape.varlen_shape: a packed batch of `count` sequences holding `total` query rows
// compares as `count` sequences of their mean length, rounded to the nearest integer with
// ties to even (Python's round of the quotient; done here in integers, which gives the same
// answer for any total below 2^51), and at least 1. count >= 1, total >= 0.
inline Shape varlen_shape(long long total, long long count, long long heads,
                          long long kv_heads) {
  long long mean = total / count;
  const long long twice_rest = 2 * (total % count);
  if (twice_rest > count || (twice_rest == count && mean % 2 == 1)) ++mean;
  if (mean < 1) mean = 1;
  return {mean, mean, count, heads, kv_heads};
}

// The same over a plain array of shapes.
inline int nearest(const Shape& asked, const Shape* tuned, int count, int sm_count,
                   double* distance_out = nullptr, bool phased = true) {
  return nearest(
      asked, count, sm_count, [tuned](int i) -> const Shape* { return &tuned[i]; },
      distance_out, phased);
}

}  // namespace fa2tune_shape
