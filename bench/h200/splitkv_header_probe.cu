// splitkv_header_probe: decode calls through an exported header that holds a splitkv winner,
// checked against a float32 CPU reference (every row of O and LSE). header_check.sh's splitkv
// stage builds and runs it on the tuned GPU (the H200):
//
//   nvcc -std=c++17 -O2 -gencode=arch=compute_90,code=sm_90 -I/tmp \
//        -DFA2TUNE_HEADER='"fa2_tuned_splitkv.cuh"' bench/h200/splitkv_header_probe.cu -o probe
//   ./probe
//
// D=128 fp16, non-causal, GQA 32 query heads over 8 KV heads, batch 8. Per shape it runs,
// twice each (O and LSE poisoned with NaN before every call, so each call must write them):
//   cached   fa2tune_forward: the header's per-(device, stream) cached workspace;
//   caller   fa2tune_forward_with_workspace: one buffer per (nq, batch, heads, kv_heads),
//            zero-filled once and reused across every nk of that group (the documented
//            contract);
//   graph    fa2tune_forward captured into a CUDA graph after a warm-up launch on the same
//            stream (the documented way around the first launch's allocation), replayed twice.
// One "PASS ..." or "FAIL ..." line per call; a decode call must run a splitkv_ config.
// Exits 1 when any case fails, 2 on a CUDA error outside a case.
#ifndef FA2TUNE_HEADER
#define FA2TUNE_HEADER "fa2_tuned.cuh"
#endif
#include FA2TUNE_HEADER

#include <cuda_fp16.h>

#include "probe_util.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kD = 128;
constexpr int kBatch = 8;
constexpr int kHeads = 32;
constexpr int kKvHeads = 8;

struct Case {
  int nq;
  int nk;
};

struct Tensors {
  int nq = 0, nk = 0;
  std::vector<__half> q, k, v;
  std::vector<float> ref_o, ref_lse;  // [B, nq, H, D], [B, H, nq]
  __half *dq = nullptr, *dk = nullptr, *dv = nullptr, *dout = nullptr;
  float* dlse = nullptr;
};

Tensors make(const Case& c, std::mt19937& rng) {
  Tensors t;
  t.nq = c.nq;
  t.nk = c.nk;
  std::normal_distribution<float> normal(0.f, 1.f);
  auto fill = [&](std::vector<__half>& x, size_t n) {
    x.resize(n);
    for (auto& e : x) e = __float2half(normal(rng));
  };
  fill(t.q, size_t(kBatch) * c.nq * kHeads * kD);
  fill(t.k, size_t(kBatch) * c.nk * kKvHeads * kD);
  fill(t.v, size_t(kBatch) * c.nk * kKvHeads * kD);
  // float32 reference, all rows: softmax(q k^T * scale) v, natural-log LSE.
  const float scale = 1.f / std::sqrt(float(kD));
  t.ref_o.assign(t.q.size(), 0.f);
  t.ref_lse.assign(size_t(kBatch) * kHeads * c.nq, 0.f);
  std::vector<float> s(c.nk);
  for (int b = 0; b < kBatch; ++b)
    for (int h = 0; h < kHeads; ++h) {
      const int g = h / (kHeads / kKvHeads);
      for (int i = 0; i < c.nq; ++i) {
        const __half* qi = &t.q[((size_t(b) * c.nq + i) * kHeads + h) * kD];
        float mx = -INFINITY;
        for (int j = 0; j < c.nk; ++j) {
          const __half* kj = &t.k[((size_t(b) * c.nk + j) * kKvHeads + g) * kD];
          float acc = 0.f;
          for (int d = 0; d < kD; ++d) acc += __half2float(qi[d]) * __half2float(kj[d]);
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        float sum = 0.f;
        for (int j = 0; j < c.nk; ++j) sum += (s[j] = std::exp(s[j] - mx));
        float* oi = &t.ref_o[((size_t(b) * c.nq + i) * kHeads + h) * kD];
        for (int j = 0; j < c.nk; ++j) {
          const __half* vj = &t.v[((size_t(b) * c.nk + j) * kKvHeads + g) * kD];
          const float w = s[j] / sum;
          for (int d = 0; d < kD; ++d) oi[d] += w * __half2float(vj[d]);
        }
        t.ref_lse[(size_t(b) * kHeads + h) * c.nq + i] = mx + std::log(sum);
      }
    }
  CHECK_CUDA(cudaMalloc(&t.dq, t.q.size() * 2));
  CHECK_CUDA(cudaMalloc(&t.dk, t.k.size() * 2));
  CHECK_CUDA(cudaMalloc(&t.dv, t.v.size() * 2));
  CHECK_CUDA(cudaMalloc(&t.dout, t.q.size() * 2));
  CHECK_CUDA(cudaMalloc(&t.dlse, t.ref_lse.size() * 4));
  CHECK_CUDA(cudaMemcpy(t.dq, t.q.data(), t.q.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(t.dk, t.k.data(), t.k.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(t.dv, t.v.data(), t.v.size() * 2, cudaMemcpyHostToDevice));
  return t;
}

void release(Tensors& t) {
  cudaFree(t.dq);
  cudaFree(t.dk);
  cudaFree(t.dv);
  cudaFree(t.dout);
  cudaFree(t.dlse);
}

FaParams params(const Tensors& t) {
  FaParams p{};
  p.q = t.dq;
  p.k = t.dk;
  p.v = t.dv;
  p.o = t.dout;
  p.lse = t.dlse;
  p.q_row_stride = p.o_row_stride = int64_t(kHeads) * kD;
  p.k_row_stride = p.v_row_stride = int64_t(kKvHeads) * kD;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = kD;
  p.q_batch_stride = p.o_batch_stride = int64_t(t.nq) * kHeads * kD;
  p.k_batch_stride = p.v_batch_stride = int64_t(t.nk) * kKvHeads * kD;
  p.batch = kBatch;
  p.q_heads = kHeads;
  p.kv_heads = kKvHeads;
  p.nq = t.nq;
  p.nk = t.nk;
  p.softmax_scale = 1.f / std::sqrt(float(kD));
  return p;
}

void poison(const Tensors& t, cudaStream_t stream) {
  CHECK_CUDA(cudaMemsetAsync(t.dout, 0xFF, t.q.size() * 2, stream));  // NaN halves
  CHECK_CUDA(cudaMemsetAsync(t.dlse, 0xFF, t.ref_lse.size() * 4, stream));
}

int failures = 0;

// Compares the device's O and LSE with the reference and prints one line.
void check(const Tensors& t, const char* variant, int call, cudaError_t launched,
           cudaStream_t stream) {
  const char* name = fa2tune_config_name(params(t), kD, FA2TUNE_FP16, false);
  const cudaError_t synced = cudaStreamSynchronize(stream);
  float err_o = INFINITY, err_lse = INFINITY;
  if (launched == cudaSuccess && synced == cudaSuccess) {
    std::vector<__half> o(t.q.size());
    std::vector<float> lse(t.ref_lse.size());
    CHECK_CUDA(cudaMemcpy(o.data(), t.dout, o.size() * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(lse.data(), t.dlse, lse.size() * 4, cudaMemcpyDeviceToHost));
    err_o = err_lse = 0.f;
    for (size_t i = 0; i < o.size(); ++i) {
      const float e = std::fabs(__half2float(o[i]) - t.ref_o[i]);
      err_o = std::isnan(e) ? INFINITY : std::max(err_o, e);
    }
    for (size_t i = 0; i < lse.size(); ++i) {
      const float e = std::fabs(lse[i] - t.ref_lse[i]);
      err_lse = std::isnan(e) ? INFINITY : std::max(err_lse, e);
    }
  }
  const bool splitkv = name != nullptr && std::strncmp(name, "splitkv_", 8) == 0;
  const bool ok = launched == cudaSuccess && synced == cudaSuccess && splitkv &&
                  err_o <= 1e-2f && err_lse <= 1e-2f;
  failures += ok ? 0 : 1;
  std::printf("%s splitkv %s nq=%d nk=%d call=%d config=%s max_err_o=%.3g max_err_lse=%.3g%s%s\n",
              ok ? "PASS" : "FAIL", variant, t.nq, t.nk, call, name ? name : "(none)", err_o,
              err_lse, launched != cudaSuccess ? " launch=" : "",
              launched != cudaSuccess ? cudaGetErrorString(launched)
                                      : (synced != cudaSuccess ? cudaGetErrorString(synced) : ""));
  std::fflush(stdout);
}

// A batch past grid z's 65,535 through a split-Q (fa2) entry: the dispatch launches it in
// batch slices. N = 24: more rows than a decode step (Nq <= 16), which split-KV would take. Checked against a float32 reference on sequences at both ends and around the
// slice boundary (every sequence is written; a slice that was skipped keeps its NaN poison).
bool big_batch_case(cudaStream_t stream) {
  const int B = 70000, H = 1, N = 24;
  const size_t n = size_t(B) * N * H * kD;
  std::vector<__half> q(n), k(n), v(n);
  uint32_t state = 12345u;
  auto next = [&]() {  // a cheap uniform in [-1, 1): 3 x 143M values
    state = state * 1664525u + 1013904223u;
    return float(state >> 8) / float(1 << 23) - 1.f;
  };
  for (size_t i = 0; i < n; ++i) q[i] = __float2half(next());
  for (size_t i = 0; i < n; ++i) k[i] = __float2half(next());
  for (size_t i = 0; i < n; ++i) v[i] = __float2half(next());
  __half *dq, *dk, *dv, *dout;
  CHECK_CUDA(cudaMalloc(&dq, n * 2));
  CHECK_CUDA(cudaMalloc(&dk, n * 2));
  CHECK_CUDA(cudaMalloc(&dv, n * 2));
  CHECK_CUDA(cudaMalloc(&dout, n * 2));
  CHECK_CUDA(cudaMemcpy(dq, q.data(), n * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dk, k.data(), n * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dv, v.data(), n * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemsetAsync(dout, 0xFF, n * 2, stream));
  FaParams p{};
  p.q = dq; p.k = dk; p.v = dv; p.o = dout; p.lse = nullptr;
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = int64_t(H) * kD;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = kD;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = int64_t(N) * H * kD;
  p.batch = B; p.q_heads = H; p.kv_heads = H; p.nq = N; p.nk = N;
  p.softmax_scale = 1.f / std::sqrt(float(kD));
  const char* name = fa2tune_config_name(p, kD, FA2TUNE_FP16, false);
  cudaError_t err = fa2tune_forward(p, kD, FA2TUNE_FP16, false, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  std::vector<__half> o(n);
  if (err == cudaSuccess) CHECK_CUDA(cudaMemcpy(o.data(), dout, n * 2, cudaMemcpyDeviceToHost));
  float worst = err == cudaSuccess ? 0.f : INFINITY;
  bool all_written = err == cudaSuccess;
  for (size_t i = 0; err == cudaSuccess && i < n; i += 997)  // every slice left its mark
    all_written = all_written && !std::isnan(__half2float(o[i]));
  const int batches[] = {0, 1, 65534, 65535, 65536, B - 1};
  for (int b : batches) {
    if (err != cudaSuccess) break;
    for (int i = 0; i < N; ++i) {
      const size_t row = (size_t(b) * N + i) * kD;
      float s[N], mx = -INFINITY, sum = 0.f;
      for (int j = 0; j < N; ++j) {
        float acc = 0.f;
        for (int d = 0; d < kD; ++d)
          acc += __half2float(q[row + d]) * __half2float(k[(size_t(b) * N + j) * kD + d]);
        s[j] = acc * p.softmax_scale;
        mx = std::max(mx, s[j]);
      }
      for (int j = 0; j < N; ++j) sum += (s[j] = std::exp(s[j] - mx));
      for (int d = 0; d < kD; ++d) {
        float ref = 0.f;
        for (int j = 0; j < N; ++j) ref += s[j] / sum * __half2float(v[(size_t(b) * N + j) * kD + d]);
        const float e = std::fabs(__half2float(o[row + d]) - ref);
        worst = std::isnan(e) ? INFINITY : std::max(worst, e);
      }
    }
  }
  const bool ok = err == cudaSuccess && all_written && worst <= 1e-2f && name != nullptr &&
                  std::strncmp(name, "splitkv_", 8) != 0;
  std::printf("%s big-batch B=%d N=%d config=%s max_err_o=%.3g written=%d%s%s\n",
              ok ? "PASS" : "FAIL", B, N, name ? name : "(none)", worst, int(all_written),
              err != cudaSuccess ? " err=" : "", err != cudaSuccess ? cudaGetErrorString(err) : "");
  cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout);
  return ok;
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, cc %d.%d\n", prop.name, prop.major, prop.minor);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::mt19937 rng(1234);
  // Groups of one (nq, batch, heads, kv_heads): the caller's buffer is shared within one.
  const std::vector<std::vector<Case>> groups = {
      {{1, 8192}, {1, 1000}, {1, 33}, {1, 4096}},  // 33: two key tiles; 1000: a partial tile
      {{2, 8192}, {2, 517}},
  };
  for (const auto& group : groups) {
    std::vector<Tensors> ts;
    for (const Case& c : group) ts.push_back(make(c, rng));
    size_t bytes = 0;
    for (const Tensors& t : ts)
      bytes = std::max(bytes, fa2tune_workspace_size(params(t), kD, FA2TUNE_FP16, false));
    void* workspace = nullptr;
    if (bytes > 0) {
      CHECK_CUDA(cudaMalloc(&workspace, bytes));
      CHECK_CUDA(cudaMemset(workspace, 0, bytes));  // once, for the whole group
    }
    std::printf("group nq=%d: caller workspace %zu bytes\n", group[0].nq, bytes);
    for (Tensors& t : ts) {
      const FaParams p = params(t);
      for (int call = 1; call <= 2; ++call) {
        poison(t, stream);
        check(t, "cached", call, fa2tune_forward(p, kD, FA2TUNE_FP16, false, stream), stream);
      }
      for (int call = 1; call <= 2; ++call) {
        poison(t, stream);
        const cudaError_t err = fa2tune_forward_with_workspace(p, kD, FA2TUNE_FP16, false,
                                                               workspace, bytes, stream);
        check(t, "caller", call, err, stream);
      }
      // The cached workspace already exists for this stream and shape (the warm-up above).
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      cudaError_t err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
      if (err == cudaSuccess) {
        const cudaError_t launched = fa2tune_forward(p, kD, FA2TUNE_FP16, false, stream);
        err = cudaStreamEndCapture(stream, &graph);
        if (launched != cudaSuccess) err = launched;
      }
      if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
      for (int call = 1; call <= 2; ++call) {
        poison(t, stream);
        check(t, "graph", call, err == cudaSuccess ? cudaGraphLaunch(exec, stream) : err, stream);
      }
      if (exec != nullptr) cudaGraphExecDestroy(exec);
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();  // a failed capture's sticky-free error is reported above
    }
    cudaFree(workspace);
    for (Tensors& t : ts) release(t);
  }
  // A buffer too small is refused, not overrun.
  {
    std::mt19937 rng2(7);
    Tensors t = make({1, 8192}, rng2);
    const FaParams p = params(t);
    const size_t need = fa2tune_workspace_size(p, kD, FA2TUNE_FP16, false);
    void* small = nullptr;
    CHECK_CUDA(cudaMalloc(&small, 256));
    const cudaError_t err =
        fa2tune_forward_with_workspace(p, kD, FA2TUNE_FP16, false, small, need - 1, stream);
    const bool ok = need > 0 && err == cudaErrorInvalidValue;
    failures += ok ? 0 : 1;
    std::printf("%s splitkv small-workspace nq=1 nk=8192 need=%zu -> %s\n", ok ? "PASS" : "FAIL",
                need, cudaGetErrorString(err));
    cudaFree(small);
    release(t);
  }
  failures += big_batch_case(stream) ? 0 : 1;
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("splitkv probe: %d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
