// Micro-tests of the fa3 building blocks (one warpgroup, one tile), for bench/hopper/fa3_check.py:
// TMA 4-d loads into 128B-swizzled shared memory, S = Q K^T with both operands through K-major
// descriptors, O = P V with V through the N-major (transposed) descriptor and P from registers
// (RS) or from swizzled shared memory (SS). Same descriptor arithmetic as fa3_fwd.cuh.
#include "fa3_fwd.cuh"

#ifndef MICRO_D
#define MICRO_D 128
#endif
#ifndef MICRO_BN
#define MICRO_BN 128
#endif

namespace {
constexpr int D = MICRO_D, BN = MICRO_BN, kBoxes = (D + 63) / 64;
constexpr int kQBox = 64 * 128, kKVBox = BN * 128;
constexpr int kQOff = 0, kKOff = kBoxes * kQBox, kVOff = kKOff + kBoxes * kKVBox;
constexpr int kPOff = kVOff + kBoxes * kKVBox, kBarOff = kPOff + ((BN + 63) / 64) * 8192;
constexpr int kSmem = 1024 + kBarOff + 64;
}  // namespace

extern "C" __global__ void __launch_bounds__(128, 1)
    fa3_micro(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
              const __grid_constant__ CUtensorMap tv, float* s_out, const __half* p_in,
              float* o_rs, float* o_ss, int* smem_bytes_out) {
  using namespace fa3;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t sbase = (raw + 1023u) & ~1023u;
  unsigned char* gbase = smem_raw + (sbase - raw);
  const uint32_t bar = sbase + kBarOff;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  if (tid == 0) {
    *smem_bytes_out = kSmem;
    mbar_init(bar, 1);
    mbar_fence_init();
  }
  __syncthreads();
  if (tid == 0) {
    mbar_arrive_expect_tx(bar, kBoxes * (kQBox + 2 * kKVBox));
    for (int b = 0; b < kBoxes; ++b) {
      tma_load_4d(sbase + kQOff + b * kQBox, &tq, bar, 64 * b, 0, 0, 0);
      tma_load_4d(sbase + kKOff + b * kKVBox, &tk, bar, 64 * b, 0, 0, 0);
      tma_load_4d(sbase + kVOff + b * kKVBox, &tv, bar, 64 * b, 0, 0, 0);
    }
  }
  mbar_wait(bar, 0);

  float s[BN / 2];
  const uint64_t qd = make_desc_sw128(sbase + kQOff, 16, 1024);
  const uint64_t kd = make_desc_sw128(sbase + kKOff, 16, 1024);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
    Wgmma<BN>::ss<__half, 0>(s, desc_advance(qd, (ks / 4) * kQBox + (ks % 4) * 32),
                             desc_advance(kd, (ks / 4) * kKVBox + (ks % 4) * 32), ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(s);
#pragma unroll
  for (int i = 0; i < BN / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        s_out[(16 * warp + g + 8 * h) * BN + 8 * i + 2 * t + e] = s[4 * i + 2 * h + e];

  // P V, P from registers (fragment read from global in the A layout).
  const uint64_t vd = make_desc_sw128(sbase + kVOff, kKVBox, 1024);
  uint32_t pf[BN / 16][4];
  auto pin = [&](int r, int c) {
    __half2 h2 = *reinterpret_cast<const __half2*>(p_in + r * BN + c);
    return *reinterpret_cast<uint32_t*>(&h2);
  };
  const int r0 = 16 * warp + g;
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    pf[kk][0] = pin(r0, 16 * kk + 2 * t);
    pf[kk][1] = pin(r0 + 8, 16 * kk + 2 * t);
    pf[kk][2] = pin(r0, 16 * kk + 8 + 2 * t);
    pf[kk][3] = pin(r0 + 8, 16 * kk + 8 + 2 * t);
  }
  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  fence_regs(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk)
    Wgmma<D>::rs<__half, 1>(o, pf[kk], desc_advance(vd, kk * 2048), 1);
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(o);
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) o_rs[(r0 + 8 * h) * D + 8 * i + 2 * t + e] = o[4 * i + 2 * h + e];

  // P V, P stored 128B-swizzled in shared memory.
#pragma unroll
  for (int i = 0; i < BN / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h;
      *reinterpret_cast<uint32_t*>(gbase + kPOff + (i / 8) * 8192 + r * 128 +
                                   (((i % 8) ^ g) * 16) + 4 * t) = pin(r, 8 * i + 2 * t);
    }
  fence_proxy_async();
  __syncthreads();
  const uint64_t pd = make_desc_sw128(sbase + kPOff, 16, 1024);
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  fence_regs(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk)
    Wgmma<D>::ss<__half, 1>(o, desc_advance(pd, (kk / 4) * 8192 + (kk % 4) * 32),
                            desc_advance(vd, kk * 2048), 1);
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(o);
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) o_ss[(r0 + 8 * h) * D + 8 * i + 2 * t + e] = o[4 * i + 2 * h + e];
}
