// A slow but obviously correct attention forward with the fa2tune kernel ABI: one thread per
// (query row, head, batch), fp32 accumulation with an online softmax, any N, GQA, and the
// bottom-right causal mask (key j visible to query i iff j <= i + nk - nq). Rows that see no
// key get O = 0 and LSE = -inf. It is the "good" kernel of tests/test_gpu_faults.py, so those
// tests do not depend on the real template.
//
// Launch geometry is the ABI's: grid (ceil(nq / br), q_heads, batch), block 32 * warps. The
// exported configs all have br == 32 * warps, so each thread owns exactly one query row.
#include "fa2_params.cuh"

template <bool BF16>
__device__ __forceinline__ float load(const unsigned short* p, long long i) {
  return BF16 ? bf16_to_f32(p[i]) : fp16_to_f32(p[i]);
}

template <bool BF16>
__device__ __forceinline__ unsigned short store(float f) {
  return BF16 ? f32_to_bf16(f) : f32_to_fp16(f);
}

template <int D, bool BF16, bool CAUSAL>
__device__ void naive_attention(const FaParams& p) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  if (row >= p.nq) return;
  const int kh = h / (p.q_heads / p.kv_heads);
  const auto* q = static_cast<const unsigned short*>(p.q) + b * p.q_batch_stride +
                  h * p.q_head_stride + row * p.q_row_stride;
  const auto* k = static_cast<const unsigned short*>(p.k) + b * p.k_batch_stride +
                  kh * p.k_head_stride;
  const auto* v = static_cast<const unsigned short*>(p.v) + b * p.v_batch_stride +
                  kh * p.v_head_stride;
  auto* o = static_cast<unsigned short*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride +
            row * p.o_row_stride;

  float qf[D];
  float acc[D];
#pragma unroll
  for (int d = 0; d < D; ++d) {
    qf[d] = load<BF16>(q, d);
    acc[d] = 0.f;
  }
  const float neg_inf = __int_as_float(0xff800000);
  float m = neg_inf;
  float l = 0.f;
  const int last = CAUSAL ? min(p.nk - 1, row + p.nk - p.nq) : p.nk - 1;
  for (int j = 0; j <= last; ++j) {
    const unsigned short* kj = k + j * p.k_row_stride;
    float s = 0.f;
#pragma unroll
    for (int d = 0; d < D; ++d) s += qf[d] * load<BF16>(kj, d);
    s *= p.softmax_scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float pj = expf(s - m_new);
    l = l * corr + pj;
    const unsigned short* vj = v + j * p.v_row_stride;
#pragma unroll
    for (int d = 0; d < D; ++d) acc[d] = acc[d] * corr + pj * load<BF16>(vj, d);
    m = m_new;
  }
  const bool dead = last < 0;
  const float inv = dead ? 0.f : 1.f / l;
#pragma unroll
  for (int d = 0; d < D; ++d) o[d] = store<BF16>(acc[d] * inv);
  if (p.lse != nullptr) {
    p.lse[(static_cast<long long>(b) * p.q_heads + h) * p.nq + row] = dead ? neg_inf : m + logf(l);
  }
}

// Named as Fa2Config names so the loader finds them by config.name (br64 = 2 warps * 32).
extern "C" __global__ void fa2_d64_fp16_full_br64_bc64_w2_s1_pad0(FaParams p) {
  naive_attention<64, false, false>(p);
}
extern "C" __global__ void fa2_d64_fp16_causal_br64_bc64_w2_s1_pad0(FaParams p) {
  naive_attention<64, false, true>(p);
}
extern "C" __global__ void fa2_d64_bf16_full_br64_bc64_w2_s1_pad0(FaParams p) {
  naive_attention<64, true, false>(p);
}
extern "C" __global__ void fa2_d64_bf16_causal_br64_bc64_w2_s1_pad0(FaParams p) {
  naive_attention<64, true, true>(p);
}
