// fa2tune test program: the mma.sync families' variant kernels (fa2, splitkv) against a
// brute-force host reference.
//
// Built and run by tests/families/fa2/test_variant_gpu.py (argument "fa2") and
// tests/families/splitkv/test_variant_gpu.py ("splitkv"): nvcc and one GPU, no torch. For each
// (config, case) it fills Q, K, V and the sinks with random values, poisons O and LSE with
// NaN, launches fa2::launch_variant / launch_varlen_variant or splitkv::launch_variant (its
// own workspace; the splits follow nk) and compares with a double
// reference that applies the rules of core/variant.py literally, key by key: bottom-right
// positions pos = i + nk - nq, the window [pos - left, pos + right], pos's chunk, causality,
// softcap * tanh(s / softcap), the sink logit in the denominator; a row that sees no key has
// O = 0 and LSE = -inf (or the sink logit). Prints one line per case and "FAILED" lines; the
// exit status is the number of failed cases (capped at 100).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include <cstring>

#include "fa2_fwd.cuh"
#include "splitkv_launch.cuh"

#define CHECK(x)                                                                  \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(100);                                                             \
    }                                                                             \
  } while (0)

struct Case {
  int batch, heads, kv_heads, nq, nk;  // varlen: nq, nk are the longest; lengths vary below
  int left, right, chunk;
  float softcap;
  bool sinks;
};

static int floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

static bool visible(bool causal, const Case& c, int nq, int nk, int i, int j) {
  const int pos = i + nk - nq;
  if (causal && j > pos) return false;
  if (c.left >= 0 && j < pos - c.left) return false;
  if (c.right >= 0 && j > pos + c.right) return false;
  if (c.chunk > 0 && floor_div(j, c.chunk) != floor_div(pos, c.chunk)) return false;
  return true;
}

template <class Elem>
static float to_float(Elem x);
template <>
float to_float<__half>(__half x) { return __half2float(x); }
template <>
float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class Elem>
static Elem from_float(float x);
template <>
__half from_float<__half>(float x) { return __float2half(x); }
template <>
__nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// Runs one case; returns true when it passes. Layout [total rows, heads, D] (bnhd, packed when
// varlen), LSE [batch, heads, nq] (dense) or [heads, total_q] (varlen). `launch(p, vl, var)`
// launches T's kernel.
template <class T, bool Varlen, class Launch>
static bool run_case(const char* name, const Case& c, unsigned seed, const Launch& launch) {
  using Elem = typename T::Elem;
  constexpr int D = T::DHead;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<int> lq(c.batch), lk(c.batch), cq(c.batch + 1, 0), ck(c.batch + 1, 0);
  for (int b = 0; b < c.batch; ++b) {
    lq[b] = c.nq, lk[b] = c.nk;
    if (Varlen && b > 0) {  // shorter sequences after the first (which has the longest)
      lq[b] = 1 + static_cast<int>(rng() % c.nq);
      lk[b] = 1 + static_cast<int>(rng() % c.nk);
    }
    cq[b + 1] = cq[b] + lq[b];
    ck[b + 1] = ck[b] + lk[b];
  }
  const int tq = Varlen ? cq[c.batch] : c.batch * c.nq;
  const int tk = Varlen ? ck[c.batch] : c.batch * c.nk;
  std::vector<Elem> q(size_t(tq) * c.heads * D), k(size_t(tk) * c.kv_heads * D),
      v(size_t(tk) * c.kv_heads * D);
  for (auto& x : q) x = from_float<Elem>(normal(rng));
  for (auto& x : k) x = from_float<Elem>(normal(rng));
  for (auto& x : v) x = from_float<Elem>(normal(rng));
  std::vector<float> sinks(c.heads);
  for (auto& x : sinks) x = 2.f * normal(rng);

  Elem *dq, *dk, *dv, *dout;
  float *dlse, *dsinks;
  int *dcq, *dck;
  CHECK(cudaMalloc(&dq, q.size() * sizeof(Elem)));
  CHECK(cudaMalloc(&dk, k.size() * sizeof(Elem)));
  CHECK(cudaMalloc(&dv, v.size() * sizeof(Elem)));
  CHECK(cudaMalloc(&dout, q.size() * sizeof(Elem)));
  CHECK(cudaMalloc(&dlse, size_t(tq) * c.heads * sizeof(float)));
  CHECK(cudaMalloc(&dsinks, c.heads * sizeof(float)));
  CHECK(cudaMalloc(&dcq, cq.size() * sizeof(int)));
  CHECK(cudaMalloc(&dck, ck.size() * sizeof(int)));
  CHECK(cudaMemcpy(dq, q.data(), q.size() * sizeof(Elem), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dk, k.data(), k.size() * sizeof(Elem), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dv, v.data(), v.size() * sizeof(Elem), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dsinks, sinks.data(), sinks.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dcq, cq.data(), cq.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dck, ck.data(), ck.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(dout, 0xff, q.size() * sizeof(Elem)));  // NaN
  CHECK(cudaMemset(dlse, 0xff, size_t(tq) * c.heads * sizeof(float)));

  FaParams p{};
  p.q = dq, p.k = dk, p.v = dv, p.o = dout, p.lse = dlse;
  p.q_row_stride = p.o_row_stride = int64_t{c.heads} * D;
  p.q_head_stride = p.o_head_stride = D;
  p.q_batch_stride = p.o_batch_stride = int64_t{c.nq} * c.heads * D;
  p.k_row_stride = p.v_row_stride = int64_t{c.kv_heads} * D;
  p.k_head_stride = p.v_head_stride = D;
  p.k_batch_stride = p.v_batch_stride = int64_t{c.nk} * c.kv_heads * D;
  p.batch = c.batch, p.q_heads = c.heads, p.kv_heads = c.kv_heads, p.nq = c.nq, p.nk = c.nk;
  p.softmax_scale = 1.f / std::sqrt(float(D));
  FaVariant var{};
  var.window_left = T::Local ? c.left : -1;
  var.window_right = T::Local ? (T::Causal ? 0 : c.right) : -1;  // causal: right 0
  var.chunk = T::Local ? c.chunk : 0;
  var.softcap = T::Softcap ? c.softcap : 0.f;
  var.sinks = T::Sinks && c.sinks ? dsinks : nullptr;  // null: no sink
  CHECK(launch(p, FaVarlen{dcq, dck, tq, 0}, var));
  CHECK(cudaDeviceSynchronize());
  std::vector<Elem> out(q.size());
  std::vector<float> lse(size_t(tq) * c.heads);
  CHECK(cudaMemcpy(out.data(), dout, out.size() * sizeof(Elem), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(lse.data(), dlse, lse.size() * 4, cudaMemcpyDeviceToHost));
  cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dlse), cudaFree(dsinks);
  cudaFree(dcq), cudaFree(dck);

  const Case eff{c.batch, c.heads, c.kv_heads, c.nq, c.nk, var.window_left, var.window_right,
                 var.chunk, var.softcap, T::Sinks && c.sinks};
  double max_err = 0, max_lse_err = 0;
  int bad = 0;
  std::vector<double> sc(c.nk), acc(D);
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.heads; ++h) {
      const int kvh = h / (c.heads / c.kv_heads);
      for (int i = 0; i < lq[b]; ++i) {
        const int qrow = Varlen ? cq[b] + i : b * c.nq + i;
        double mx = eff.sinks ? sinks[h] : -INFINITY;
        for (int j = 0; j < lk[b]; ++j) {
          sc[j] = -INFINITY;
          if (!visible(T::Causal, eff, lq[b], lk[b], i, j)) continue;
          const int krow = Varlen ? ck[b] + j : b * c.nk + j;
          double s = 0;
          for (int d = 0; d < D; ++d)
            s += double(to_float(q[(size_t(qrow) * c.heads + h) * D + d])) *
                 to_float(k[(size_t(krow) * c.kv_heads + kvh) * D + d]);
          s *= p.softmax_scale;
          if (eff.softcap > 0) s = eff.softcap * std::tanh(s / eff.softcap);
          sc[j] = s;
          mx = std::max(mx, s);
        }
        double l = eff.sinks ? std::exp(sinks[h] - mx) : 0;
        for (int d = 0; d < D; ++d) acc[d] = 0;
        for (int j = 0; j < lk[b]; ++j) {
          if (sc[j] == -INFINITY) continue;
          const double w = std::exp(sc[j] - mx);
          l += w;
          const int krow = Varlen ? ck[b] + j : b * c.nk + j;
          for (int d = 0; d < D; ++d) acc[d] += w * to_float(v[(size_t(krow) * c.kv_heads + kvh) * D + d]);
        }
        const double ref_lse = l > 0 ? mx + std::log(l) : -INFINITY;
        for (int d = 0; d < D; ++d) {
          const double ref = l > 0 ? acc[d] / l : 0.0;
          const double got = to_float(out[(size_t(qrow) * c.heads + h) * D + d]);
          const double err = std::fabs(got - ref);
          if (!(err <= 2e-2 + 1e-2 * std::fabs(ref))) ++bad;
          if (err > max_err || std::isnan(err)) max_err = std::isnan(err) ? INFINITY : err;
        }
        const float got_lse = Varlen ? lse[size_t(h) * tq + qrow]
                                        : lse[(size_t(b) * c.heads + h) * c.nq + i];
        double lerr = 0;
        if (std::isinf(ref_lse)) lerr = got_lse == -INFINITY ? 0 : INFINITY;
        else lerr = std::fabs(got_lse - ref_lse);
        if (!(lerr <= 1e-2)) ++bad;
        if (lerr > max_lse_err || std::isnan(lerr)) max_lse_err = std::isnan(lerr) ? INFINITY : lerr;
      }
    }
  std::printf("%s %s b%d h%d/%d nq%d nk%d win(%d,%d) chunk%d cap%g: max|dO| %.3g max|dLSE| %.3g\n",
              bad ? "FAILED" : "ok", name, c.batch, c.heads, c.kv_heads, c.nq, c.nk, eff.left,
              eff.right, eff.chunk, eff.softcap, max_err, max_lse_err);
  return bad == 0;
}

// The cases every fa2 config runs: windows, chunks, causal windows, rows that see no key
// (nq > nk), one query row, GQA, a window past every key.
static const Case kCases[] = {
    {2, 4, 2, 300, 300, 64, 0, 0, 30.f, true},     // causal sliding window (left 64)
    {1, 2, 2, 257, 700, 100, 37, 0, 20.f, true},   // two-sided window, nk > nq
    {1, 2, 1, 700, 200, 50, 0, 0, 10.f, true},     // nq > nk: leading rows see no key
    {2, 2, 2, 513, 513, -1, -1, 96, 5.f, true},    // chunked (Llama-4), no window
    {1, 4, 4, 400, 1000, 128, 0, 256, 50.f, true}, // chunk and window and causal
    {2, 2, 2, 1, 1000, 200, 0, 0, 30.f, true},     // decode row, window
    {1, 2, 2, 130, 130, 10000, 10000, 0, 30.f, true},  // a window past every key
    {1, 2, 2, 600, 600, 0, 0, 0, 30.f, true},      // a window of one key
    {1, 2, 2, 64, 3000, 16, 5, 0, 30.f, false},    // narrow window far from key 0
};

// The cases every splitkv config runs: decode (nq 1..5 rows, GQA and MQA) with windows,
// chunks, rows that see no key (nq > nk), one key tile (one split: the block's own merge takes
// the sink), many splits past a window's tiles (neutral partials), no sink pointer.
static const Case kDecodeCases[] = {
    {2, 8, 2, 1, 5000, 256, 0, 0, 30.f, true},     // decode, sliding window: most splits empty
    {1, 8, 1, 4, 3000, 100, 0, 0, 20.f, true},     // speculative rows, MQA
    {2, 4, 4, 3, 1000, -1, -1, 128, 10.f, true},   // chunked
    {1, 8, 2, 2, 700, 1000, 1000, 0, 30.f, true},  // a window past every key
    {1, 4, 2, 5, 4, 2, 0, 0, 30.f, true},          // nq > nk: a row sees no key
    {1, 8, 2, 1, 16, 4, 0, 0, 30.f, true},         // one key tile: one split
    {1, 4, 2, 1, 9000, 16, 0, 0, 30.f, false},     // narrow window, no sink pointer
    {3, 4, 2, 2, 333, 64, 5, 32, 30.f, true},      // window and chunk, odd nk
    {1, 32, 8, 1, 8192, 1024, 0, 0, 50.f, true},   // GQA decode, a wide window
};

template <class T>
static int run_fa2(const char* name) {
  int failed = 0;
  unsigned seed = 1;
  for (const Case& c : kCases)
    failed += !run_case<T, T::Varlen>(name, c, seed++,
                                      [](const FaParams& p, const FaVarlen& vl, const FaVariant& var) {
                                        if constexpr (T::Varlen) return fa2::launch_varlen_variant<T>(p, vl, var, 0);
                                        else return fa2::launch_variant<T>(p, var, 0);
                                      });
  return failed;
}

template <class T>
static int run_splitkv(const char* name) {
  int failed = 0;
  unsigned seed = 100;
  for (const Case& c : kDecodeCases)
    failed += !run_case<T, false>(name, c, seed++,
                                  [](const FaParams& p, const FaVarlen&, const FaVariant& var) {
                                    return splitkv::launch_variant<T>(p, var, 0);
                                  });
  return failed;
}

static int splitkv_main() {
  int failed = 0;
  failed += run_splitkv<splitkv::VariantTraits<128, __half, false, 16, 32, 4, 2, 16, true, true, true>>(
      "skv_d128_fp16_r16_n32_w4_s2_k16_loc_cap_snk");
  failed += run_splitkv<splitkv::VariantTraits<128, __nv_bfloat16, true, 32, 16, 2, 2, 8, true, false, true>>(
      "skv_d128_bf16_causal_r32_n16_w2_s2_k8_loc_snk");
  failed += run_splitkv<splitkv::VariantTraits<64, __half, false, 16, 32, 4, 3, 8, false, true, false>>(
      "skv_d64_fp16_r16_n32_w4_s3_k8_cap");
  failed += run_splitkv<splitkv::VariantTraits<40, __half, true, 16, 32, 4, 2, 16, true, false, false>>(
      "skv_d40_fp16_causal_r16_n32_w4_s2_k16_loc");
  failed += run_splitkv<splitkv::VariantTraits<256, __nv_bfloat16, false, 16, 16, 4, 2, 32, false, false, true>>(
      "skv_d256_bf16_r16_n16_w4_s2_k32_snk");
  failed += run_splitkv<splitkv::VariantTraits<64, __half, false, 64, 32, 4, 2, 4, true, true, true>>(
      "skv_d64_fp16_r64_n32_w4_s2_k4_loc_cap_snk");
  failed += run_splitkv<splitkv::VariantTraits<128, __half, false, 16, 64, 1, 2, 64, true, false, true>>(
      "skv_d128_fp16_r16_n64_w1_s2_k64_loc_snk");
  return failed;
}

static int fa2_main() {
  int failed = 0;
  // Dense: every switch, each alone and together, pipeline depths 1..3, D 64/128/256.
  failed += run_fa2<fa2::Traits<64, __half, false, 64, 64, 4, 2, 8, false, false, true, true, true>>(
      "d64_fp16_s2_pad8_loc_cap_snk");
  failed += run_fa2<fa2::Traits<64, __half, true, 64, 64, 4, 3, 8, false, false, true, false, false>>(
      "d64_fp16_causal_s3_pad8_loc");
  failed += run_fa2<fa2::Traits<128, __nv_bfloat16, true, 64, 64, 4, 1, 0, true, false, true, false, true>>(
      "d128_bf16_causal_s1_swz_loc_snk");
  failed += run_fa2<fa2::Traits<128, __half, false, 128, 64, 4, 2, 0, true, false, false, true, false>>(
      "d128_fp16_s2_swz_cap");
  failed += run_fa2<fa2::Traits<128, __half, false, 64, 32, 2, 4, 0, true, false, false, false, true>>(
      "d128_fp16_w2_s4_swz_snk");
  failed += run_fa2<fa2::Traits<256, __nv_bfloat16, false, 64, 32, 4, 1, 0, true, false, true, true, true>>(
      "d256_bf16_s1_swz_loc_cap_snk");
  failed += run_fa2<fa2::Traits<40, __half, false, 64, 64, 4, 2, 8, false, false, true, false, false>>(
      "d40_fp16_s2_pad8_loc");
  // Packed sequences.
  failed += run_fa2<fa2::Traits<64, __half, true, 64, 64, 4, 2, 8, false, true, true, true, true>>(
      "d64_fp16_causal_s2_vl_loc_cap_snk");
  failed += run_fa2<fa2::Traits<128, __nv_bfloat16, false, 64, 64, 4, 3, 0, true, true, true, false, false>>(
      "d128_bf16_s3_swz_vl_loc");
  return failed;
}

int main(int argc, char** argv) {
  if (argc != 2 || (std::strcmp(argv[1], "fa2") != 0 && std::strcmp(argv[1], "splitkv") != 0)) {
    std::printf("usage: %s fa2|splitkv\n", argv[0]);
    return 100;
  }
  const int failed = std::strcmp(argv[1], "fa2") == 0 ? fa2_main() : splitkv_main();
  std::printf("%d failed\n", failed);
  return failed > 99 ? 99 : failed;
}
