// fa2_example: call a header exported by `fa2tune export` and check it against a CPU reference.
//
//   fa2tune export --gpu "NVIDIA H200" --d 64,128 -o fa2_tuned.cuh
//   nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -I. \
//        -DFA2TUNE_HEADER='"fa2_tuned.cuh"' examples/fa2_example.cu -o fa2_example
//   ./fa2_example --d 64,128 --n 128,1000,4096 --causal 0,1 --dtype fp16
//
// For every (D, N, causal) it fills Q, K, V [batch, N, heads, D] with random values, runs
// fa2tune_forward (with the LSE output), and recomputes a few rows of O and LSE in float on the
// CPU. It prints the config the header chose and the max error, and exits 1 on a mismatch
// (2 on a CUDA or usage error).
#ifndef FA2TUNE_HEADER
#define FA2TUNE_HEADER "fa2_tuned.cuh"
#endif
#include FA2TUNE_HEADER

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

#define CHECK_CUDA(expr)                                                                  \
  do {                                                                                    \
    const cudaError_t err_ = (expr);                                                      \
    if (err_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                  \
                   cudaGetErrorString(err_));                                             \
      std::exit(2);                                                                       \
    }                                                                                     \
  } while (0)

struct Options {
  std::vector<int> ds{64, 128};
  std::vector<int> ns{128, 1000, 2048};
  std::vector<int> causal{0, 1};
  fa2tune_dtype dtype = FA2TUNE_FP16;
  int batch = 2;
  int heads = 4;
  int kv_heads = 2;  // GQA: two query heads per K/V head
  int rows = 8;      // rows checked per case
  unsigned seed = 1234;
};

std::vector<int> parse_list(const char* arg) {
  std::vector<int> out;
  std::string s(arg);
  std::size_t pos = 0;
  while (pos <= s.size()) {
    const std::size_t comma = s.find(',', pos);
    const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos
                                                                       : comma - pos);
    if (!item.empty()) out.push_back(std::atoi(item.c_str()));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--d 64,128] [--n 128,1000,2048] [--causal 0,1] [--dtype fp16|bf16]\n"
               "          [--batch 2] [--heads 4] [--kv-heads 2] [--rows 8] [--seed 1234]\n",
               argv0);
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strcmp(a, "--help") == 0 || std::strcmp(a, "-h") == 0) return false;
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (std::strcmp(a, "--d") == 0) o.ds = parse_list(v);
    else if (std::strcmp(a, "--n") == 0) o.ns = parse_list(v);
    else if (std::strcmp(a, "--causal") == 0) o.causal = parse_list(v);
    else if (std::strcmp(a, "--batch") == 0) o.batch = std::atoi(v);
    else if (std::strcmp(a, "--heads") == 0) o.heads = std::atoi(v);
    else if (std::strcmp(a, "--kv-heads") == 0) o.kv_heads = std::atoi(v);
    else if (std::strcmp(a, "--rows") == 0) o.rows = std::atoi(v);
    else if (std::strcmp(a, "--seed") == 0) o.seed = static_cast<unsigned>(std::atoi(v));
    else if (std::strcmp(a, "--dtype") == 0) {
      if (std::strcmp(v, "fp16") == 0) o.dtype = FA2TUNE_FP16;
      else if (std::strcmp(v, "bf16") == 0) o.dtype = FA2TUNE_BF16;
      else return false;
    } else {
      return false;
    }
  }
  for (int d : o.ds)
    if (d <= 0) return false;
  for (int n : o.ns)
    if (n <= 0) return false;
  return !o.ds.empty() && !o.ns.empty() && !o.causal.empty() && o.batch > 0 && o.heads > 0 &&
         o.kv_heads > 0 && o.heads % o.kv_heads == 0 && o.rows > 0;
}

// 16-bit storage with host-side conversions from cuda_fp16.h / cuda_bf16.h.
uint16_t to_bits(float x, fa2tune_dtype dtype) {
  uint16_t bits;
  if (dtype == FA2TUNE_FP16) {
    const __half h = __float2half_rn(x);
    std::memcpy(&bits, &h, 2);
  } else {
    const __nv_bfloat16 h = __float2bfloat16_rn(x);
    std::memcpy(&bits, &h, 2);
  }
  return bits;
}

float from_bits(uint16_t bits, fa2tune_dtype dtype) {
  if (dtype == FA2TUNE_FP16) {
    __half h;
    std::memcpy(&h, &bits, 2);
    return __half2float(h);
  }
  __nv_bfloat16 h;
  std::memcpy(&h, &bits, 2);
  return __bfloat162float(h);
}

struct CaseResult {
  float max_err_o = 0.f;
  float max_err_lse = 0.f;
};

// One (D, N, causal) case; returns false on a mismatch.
bool run_case(const Options& o, int d, int n, bool causal, std::mt19937& rng) {
  const int64_t row = static_cast<int64_t>(o.heads) * d;  // [B, N, H, D]: a token's heads
  const int64_t kv_row = static_cast<int64_t>(o.kv_heads) * d;
  const int64_t q_elems = static_cast<int64_t>(o.batch) * n * row;
  const int64_t kv_elems = static_cast<int64_t>(o.batch) * n * kv_row;
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<uint16_t> hq(q_elems), hk(kv_elems), hv(kv_elems), ho(q_elems);
  for (auto& x : hq) x = to_bits(dist(rng), o.dtype);
  for (auto& x : hk) x = to_bits(dist(rng), o.dtype);
  for (auto& x : hv) x = to_bits(dist(rng), o.dtype);
  std::vector<float> hlse(static_cast<std::size_t>(o.batch) * o.heads * n);

  void *dq, *dk, *dv, *dout;
  float* dlse;
  CHECK_CUDA(cudaMalloc(&dq, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&dk, kv_elems * 2));
  CHECK_CUDA(cudaMalloc(&dv, kv_elems * 2));
  CHECK_CUDA(cudaMalloc(&dout, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&dlse, hlse.size() * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(dq, hq.data(), q_elems * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dk, hk.data(), kv_elems * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dv, hv.data(), kv_elems * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(dout, 0xff, q_elems * 2));  // NaN pattern: unwritten rows show up

  FaParams p{};
  p.q = dq;
  p.k = dk;
  p.v = dv;
  p.o = dout;
  p.lse = dlse;
  p.q_batch_stride = n * row;
  p.q_head_stride = d;
  p.q_row_stride = row;
  p.k_batch_stride = p.v_batch_stride = n * kv_row;
  p.k_head_stride = p.v_head_stride = d;
  p.k_row_stride = p.v_row_stride = kv_row;
  p.o_batch_stride = n * row;
  p.o_head_stride = d;
  p.o_row_stride = row;
  p.batch = o.batch;
  p.q_heads = o.heads;
  p.kv_heads = o.kv_heads;
  p.nq = n;
  p.nk = n;
  p.softmax_scale = 1.f / std::sqrt(static_cast<float>(d));

  const char* name = fa2tune_config_name(p, d, o.dtype, causal);
  const cudaError_t launched = fa2tune_forward(p, d, o.dtype, causal, nullptr);
  if (launched != cudaSuccess) {
    std::fprintf(stderr, "D=%d N=%d causal=%d: fa2tune_forward failed: %s (config %s)\n", d, n,
                 causal ? 1 : 0, cudaGetErrorString(launched), name ? name : "none");
    std::exit(2);
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemcpy(ho.data(), dout, q_elems * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(hlse.data(), dlse, hlse.size() * sizeof(float),
                        cudaMemcpyDeviceToHost));

  // Rows to check: first, last, and random ones, over random (batch, head).
  std::uniform_int_distribution<int> pick_row(0, n - 1), pick_b(0, o.batch - 1),
      pick_h(0, o.heads - 1);
  CaseResult res;
  std::vector<float> s(n), acc(d);
  for (int r = 0; r < o.rows; ++r) {
    const int i = r == 0 ? 0 : (r == 1 ? n - 1 : pick_row(rng));
    const int b = pick_b(rng), h = pick_h(rng), kvh = h / (o.heads / o.kv_heads);
    const uint16_t* qrow = hq.data() + b * p.q_batch_stride + i * row + h * d;
    const int visible = causal ? i + 1 : n;  // nq == nk: the diagonal is the main one
    float mx = -INFINITY;
    for (int j = 0; j < visible; ++j) {
      const uint16_t* krow = hk.data() + b * p.k_batch_stride + j * kv_row + kvh * d;
      float dot = 0.f;
      for (int c = 0; c < d; ++c) dot += from_bits(qrow[c], o.dtype) * from_bits(krow[c], o.dtype);
      s[j] = dot * p.softmax_scale;
      mx = std::fmax(mx, s[j]);
    }
    float sum = 0.f;
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int j = 0; j < visible; ++j) {
      const float e = std::exp(s[j] - mx);
      sum += e;
      const uint16_t* vrow = hv.data() + b * p.v_batch_stride + j * kv_row + kvh * d;
      for (int c = 0; c < d; ++c) acc[c] += e * from_bits(vrow[c], o.dtype);
    }
    const uint16_t* orow = ho.data() + b * p.o_batch_stride + i * row + h * d;
    for (int c = 0; c < d; ++c) {
      const float err = std::fabs(from_bits(orow[c], o.dtype) - acc[c] / sum);
      res.max_err_o = std::isnan(err) ? INFINITY : std::fmax(res.max_err_o, err);
    }
    const float lse_ref = mx + std::log(sum);
    const float lse_got = hlse[(static_cast<std::size_t>(b) * o.heads + h) * n + i];
    const float lerr = std::fabs(lse_got - lse_ref);
    res.max_err_lse = std::isnan(lerr) ? INFINITY : std::fmax(res.max_err_lse, lerr);
  }

  CHECK_CUDA(cudaFree(dq));
  CHECK_CUDA(cudaFree(dk));
  CHECK_CUDA(cudaFree(dv));
  CHECK_CUDA(cudaFree(dout));
  CHECK_CUDA(cudaFree(dlse));

  // fp16 keeps 11 significant bits, bf16 8; P is rounded to the element type before P V.
  const float tol_o = o.dtype == FA2TUNE_FP16 ? 1e-2f : 4e-2f;
  const float tol_lse = 1e-2f;
  const bool ok = res.max_err_o <= tol_o && res.max_err_lse <= tol_lse;
  std::printf("D=%-3d N=%-6d %-6s %-4s config=%-44s max|dO|=%.3e max|dLSE|=%.3e  %s\n", d, n,
              causal ? "causal" : "full", o.dtype == FA2TUNE_FP16 ? "fp16" : "bf16",
              name ? name : "?", res.max_err_o, res.max_err_lse, ok ? "ok" : "MISMATCH");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) {
    usage(argv[0]);
    return 2;
  }
  int dev = 0;
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDevice(&dev));
  CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
  std::printf("device %d: %s (sm_%d%d)\n", dev, prop.name, prop.major, prop.minor);

  std::mt19937 rng(o.seed);
  int failures = 0;
  for (int d : o.ds)
    for (int n : o.ns)
      for (int c : o.causal)
        if (!run_case(o, d, n, c != 0, rng)) ++failures;
  if (failures != 0) {
    std::printf("%d case(s) MISMATCH\n", failures);
    return 1;
  }
  std::printf("all cases ok\n");
  return 0;
}
