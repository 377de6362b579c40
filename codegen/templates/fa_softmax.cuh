// fa2tune: the online softmax every family's kernel runs on its fp32 score fragments.
//
// A thread holds, per 16-row slice of the tile, two rows (h = 0: row g, h = 1: row g + 8) of
// its quad; element e (0, 1) of row h in n8 column tile i sits at fragment index 4 i + 2 h + e.
// That is the C layout of mma.sync m16n8k16 and of wgmma m64nNk16 alike, so both GEMM kinds
// share the pieces below:
//
//   quad_max(x), quad_sum(x)        reduce over the four threads of a quad (one row)
//   row_max_of<NT>(s, h, mx)        mx and the row's maxima over NT n8 tiles
//   online_step(row_max, mx, scale_log2)
//                                   the running max becomes mx; returns the exp2 offset of the
//                                   new max (m_scaled) and alpha, which rescales the old sums
//                                   and O. -inf guards: a row that has seen no key keeps max
//                                   -inf, its offset is 0 so exp2(-inf - 0) = 0, never NaN
//   exp_row<NT>(s, h, scale_log2, m_scaled)
//                                   p = exp2(s * scale_log2 - m_scaled) in place; their sum
//   online_softmax<MT, NT, OT>      the whole step for the mma.sync kernels (fa2, splitkv):
//                                   MT m16 tiles of NT score tiles, OT O tiles rescaled
//
// `s` is anything indexable as s(i, k) -> float& with k = 2 h + e, so the mma.sync kernels'
// [tile][4] arrays and fa3's flat accumulator read the same code.
#pragma once

#include <cstdint>

namespace fa {

constexpr float kNegInf = -__builtin_huge_valf();
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

template <int NT, class S>
__device__ __forceinline__ float row_max_of(S&& s, int h, float mx) {
#pragma unroll
  for (int i = 0; i < NT; ++i) mx = fmaxf(mx, fmaxf(s(i, 2 * h), s(i, 2 * h + 1)));
  return mx;
}

struct RowStep {
  float m_scaled;  // the new max times scale_log2 (0 while the row has seen no key)
  float alpha;     // exp2(old max - new max), scaled: 0 while the old max was -inf
};

__device__ __forceinline__ RowStep online_step(float& row_max, float mx, float scale_log2) {
  RowStep step;
  step.m_scaled = mx == kNegInf ? 0.f : mx * scale_log2;
  step.alpha = row_max == kNegInf ? 0.f : fast_exp2(row_max * scale_log2 - step.m_scaled);
  row_max = mx;
  return step;
}

template <int NT, class S>
__device__ __forceinline__ float exp_row(S&& s, int h, float scale_log2, float m_scaled) {
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float pr = fast_exp2(fmaf(s(i, 2 * h + e), scale_log2, -m_scaled));
      s(i, 2 * h + e) = pr;
      sum += pr;
    }
  return sum;
}

// The mma.sync kernels' step over a tile: new row maxima, rescale the running sums and O,
// exponentiate S in place (it becomes P), add the row sums (per thread: reduced over the quad
// only at the end). The state is the kernel's own arrays (row_max starts at -inf, row_sum at
// 0), declared beside its O accumulator.
template <int MT, int NT, int OT>
__device__ __forceinline__ void online_softmax(float (&s)[MT][NT][4], float (&o)[MT][OT][4],
                                               float (&row_max)[MT][2], float (&row_sum)[MT][2],
                                               float scale_log2) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      auto at = [&](int i, int k) -> float& { return s[mt][i][k]; };
      const float mx = quad_max(row_max_of<NT>(at, h, row_max[mt][h]));
      const RowStep st = online_step(row_max[mt][h], mx, scale_log2);
      row_sum[mt][h] *= st.alpha;
#pragma unroll
      for (int dt = 0; dt < OT; ++dt) {
        o[mt][dt][2 * h] *= st.alpha;
        o[mt][dt][2 * h + 1] *= st.alpha;
      }
      row_sum[mt][h] += exp_row<NT>(at, h, scale_log2, st.m_scaled);
    }
}

}  // namespace fa
