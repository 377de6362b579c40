// kvcache_header_probe: fa2tune_forward_kvcache through an exported header with KV-cache
// kernels of page sizes 0 (contiguous) and 16, checked against a float32 CPU reference (every
// row of O and LSE) and the cache bit for bit (the appended rows are the new K/V, every other
// valid row is unchanged). header_check.sh's kvcache stage builds and runs it on the tuned GPU:
//
//   python3 -m tests.support.kvcache_header /tmp/fa2_tuned_kvcache.cuh 'NVIDIA H200' 0,16
//   nvcc -std=c++17 -O2 -gencode=arch=compute_90,code=sm_90 -I/tmp \
//        -DFA2TUNE_HEADER='"fa2_tuned_kvcache.cuh"' bench/h200/kvcache_header_probe.cu -o probe
//   ./probe
//
// D=128 fp16, 8 query heads over 2 KV heads, capacity 4096 keys, seven sequences whose cached
// lengths are 0, 1, 15, 16, 17, 3000 and 4094 (the last one's appends run past the capacity:
// those rows are dropped and its length is clamped). Paged caches have pages of 16 keys in a
// shuffled pool, a block table wider than a sequence needs, and (one case) batch rows mapped
// to block-table rows; contiguous ones more cache rows than sequences, mapped (one case).
// Every case runs through the header's own workspace and the caller's (zero-filled once per
// case); a CUDA graph captured around one decode step (append one row, attend) is replayed
// over eight growing lengths, with the caller's workspace and with the header's own. O and
// LSE are poisoned with NaN before every call, so each call must write them.
// One "PASS ..." or "FAIL ..." line per call; exits 1 when any check fails, 2 on a CUDA error
// outside a check.
#ifndef FA2TUNE_HEADER
#define FA2TUNE_HEADER "fa2_tuned.cuh"
#endif
#include FA2TUNE_HEADER

#ifndef FA2TUNE_HAS_KVCACHE
#error "export the header with --kv-pages 0,16 (tests.support.kvcache_header)"
#endif

#include <cuda_fp16.h>

#include "probe_util.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kD = 128;
constexpr int kHeads = 8;
constexpr int kKvHeads = 2;
constexpr int kCapacity = 4096;
constexpr int kPage = 16;
constexpr int kPagesPerSeq = kCapacity / kPage;
constexpr int kTableStride = kPagesPerSeq + 3;  // wider than needed: the stride is honoured
constexpr int kRowElems = kKvHeads * kD;        // one key row of the cache
const std::vector<int> kLengths = {0, 1, 15, 16, 17, 3000, 4094};
const int kBatch = static_cast<int>(kLengths.size());

int failures = 0;

// Where a sequence's keys live in device memory: a contiguous cache ([rows, capacity, KV, D],
// row batch_idx[b]) or a paged one ([pages, 16, KV, D] through the block table).
struct Layout {
  int page = 0;                 // 0: contiguous
  std::vector<int> batch_idx;   // empty: batch row b is cache / table row b
  std::vector<int> table;       // paged: [table rows, kTableStride]
  size_t cache_elems = 0;       // elements of each of K and V

  int row(int b) const { return batch_idx.empty() ? b : batch_idx[b]; }
  // Element offset of key j of sequence b (KV head 0, column 0).
  size_t at(int b, int j) const {
    if (page == 0) return (size_t(row(b)) * kCapacity + j) * kRowElems;
    const int p = table[size_t(row(b)) * kTableStride + j / page];
    return (size_t(p) * page + j % page) * kRowElems;
  }
};

// Contiguous: `extra` spare cache rows; mapped: batch rows take cache rows in shuffled order.
Layout contiguous(bool mapped, std::mt19937& rng) {
  Layout l;
  const int rows = kBatch + 2;
  if (mapped) {
    std::vector<int> perm(rows);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    l.batch_idx.assign(perm.begin(), perm.begin() + kBatch);
  }
  l.cache_elems = size_t(rows) * kCapacity * kRowElems;
  return l;
}

// Paged: every page of every table row from one shuffled pool (with spares), the padding
// past a sequence's pages poisoned (-1: never read); mapped: batch rows take table rows in
// shuffled order, of kBatch + 1 rows.
Layout paged(bool mapped, std::mt19937& rng) {
  Layout l;
  l.page = kPage;
  const int rows = mapped ? kBatch + 1 : kBatch;
  std::vector<int> pool(size_t(rows) * kPagesPerSeq + 5);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  l.table.assign(size_t(rows) * kTableStride, -1);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < kPagesPerSeq; ++j)
      l.table[size_t(r) * kTableStride + j] = pool[size_t(r) * kPagesPerSeq + j];
  if (mapped) {
    std::vector<int> perm(rows);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    l.batch_idx.assign(perm.begin(), perm.begin() + kBatch);
  }
  l.cache_elems = pool.size() * kPage * kRowElems;
  return l;
}

template <class T>
T* upload(const std::vector<T>& host) {
  if (host.empty()) return nullptr;
  T* dev = nullptr;
  CHECK_CUDA(cudaMalloc(&dev, host.size() * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return dev;
}

std::vector<__half> randoms(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<__half> x(n);
  for (auto& e : x) e = __float2half(normal(rng));
  return x;
}

// A cache call's host state (the logical caches, [B, capacity, KV, D], what the reference
// reads) and its device buffers.
struct Call {
  const char* what;
  Layout layout;
  int nq, added;
  bool causal;
  int window_left;  // -1: none (a sliding window to the left otherwise)
  std::vector<int> seqlens;
  std::vector<__half> q, k_new, v_new;
  std::vector<__half> k_log, v_log;  // the caches as the reference sees them (before append)
  std::vector<__half> k_phys, v_phys;  // ... and as the device holds them
  __half *dq = nullptr, *dout = nullptr, *dk = nullptr, *dv = nullptr, *dk_new = nullptr,
         *dv_new = nullptr;
  float* dlse = nullptr;
  int *dseqlens = nullptr, *dbatch_idx = nullptr, *dtable = nullptr;
};

// The physical caches of the logical ones (pages and rows no sequence uses hold noise).
void place(Call& c, std::mt19937& rng) {
  c.k_phys = randoms(c.layout.cache_elems, rng);
  c.v_phys = randoms(c.layout.cache_elems, rng);
  for (int b = 0; b < kBatch; ++b)
    for (int j = 0; j < kCapacity; ++j) {
      const size_t src = (size_t(b) * kCapacity + j) * kRowElems, dst = c.layout.at(b, j);
      std::copy_n(&c.k_log[src], kRowElems, &c.k_phys[dst]);
      std::copy_n(&c.v_log[src], kRowElems, &c.v_phys[dst]);
    }
}

Call make_call(const char* what, Layout layout, int nq, int added, bool causal, int window,
               std::mt19937& rng) {
  Call c{what, std::move(layout), nq, added, causal, window, kLengths};
  c.q = randoms(size_t(kBatch) * nq * kHeads * kD, rng);
  c.k_new = randoms(size_t(kBatch) * std::max(added, 1) * kRowElems, rng);
  c.v_new = randoms(c.k_new.size(), rng);
  c.k_log = randoms(size_t(kBatch) * kCapacity * kRowElems, rng);
  c.v_log = randoms(c.k_log.size(), rng);
  place(c, rng);
  c.dq = upload(c.q);
  c.dk_new = upload(c.k_new);
  c.dv_new = upload(c.v_new);
  c.dk = upload(c.k_phys);
  c.dv = upload(c.v_phys);
  c.dseqlens = upload(c.seqlens);
  c.dbatch_idx = upload(c.layout.batch_idx);
  c.dtable = upload(c.layout.table);
  CHECK_CUDA(cudaMalloc(&c.dout, c.q.size() * 2));
  CHECK_CUDA(cudaMalloc(&c.dlse, size_t(kBatch) * kHeads * nq * 4));
  CHECK_CUDA(cudaDeviceSynchronize());  // the uploads have landed (see reset)
  return c;
}

void release(Call& c) {
  for (void* p : {static_cast<void*>(c.dq), static_cast<void*>(c.dout), static_cast<void*>(c.dk),
                  static_cast<void*>(c.dv), static_cast<void*>(c.dk_new),
                  static_cast<void*>(c.dv_new), static_cast<void*>(c.dlse),
                  static_cast<void*>(c.dseqlens), static_cast<void*>(c.dbatch_idx),
                  static_cast<void*>(c.dtable)})
    cudaFree(p);
}

// The caches back in their first state (a call with an append changed them).
void reset(const Call& c) {
  CHECK_CUDA(cudaMemcpy(c.dk, c.k_phys.data(), c.k_phys.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(c.dv, c.v_phys.data(), c.v_phys.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(c.dseqlens, c.seqlens.data(), c.seqlens.size() * 4,
                        cudaMemcpyHostToDevice));
  // A pageable cudaMemcpy may return before its DMA lands, and the calls run on a stream that
  // does not wait for the legacy one: wait here.
  CHECK_CUDA(cudaDeviceSynchronize());
}

FaParams params(const Call& c) {
  FaParams p{};
  p.q = c.dq;
  p.k = c.dk;
  p.v = c.dv;
  p.o = c.dout;
  p.lse = c.dlse;
  p.q_row_stride = p.o_row_stride = int64_t(kHeads) * kD;
  p.q_head_stride = p.o_head_stride = p.k_head_stride = p.v_head_stride = kD;
  p.q_batch_stride = p.o_batch_stride = int64_t(c.nq) * kHeads * kD;
  p.k_row_stride = p.v_row_stride = kRowElems;
  // Between cache rows (contiguous) or pages (paged).
  p.k_batch_stride = p.v_batch_stride =
      int64_t(c.layout.page == 0 ? kCapacity : c.layout.page) * kRowElems;
  p.batch = kBatch;
  p.q_heads = kHeads;
  p.kv_heads = kKvHeads;
  p.nq = c.nq;
  p.nk = kCapacity;
  p.softmax_scale = 1.f / std::sqrt(float(kD));
  return p;
}

FaKvCache kv_cache(const Call& c) {
  return {c.dseqlens, c.dbatch_idx, c.dtable, c.layout.page == 0 ? 0 : kTableStride, c.added};
}

FaKvAppend kv_append(const Call& c) {
  FaKvAppend a{};
  a.k_new = c.dk_new;
  a.v_new = c.dv_new;
  a.k_batch_stride = a.v_batch_stride = int64_t(c.added) * kRowElems;
  a.k_row_stride = a.v_row_stride = kRowElems;
  a.k_head_stride = a.v_head_stride = kD;
  a.rows = c.added;  // page_size and chunks are the header's to set
  return a;
}

FaVariant kv_variant(const Call& c) { return {c.window_left, -1, 0, 0.f, nullptr}; }

// One call through the API: `caller` the caller's workspace, else the header's own.
cudaError_t launch(const Call& c, void* workspace, size_t bytes, bool caller,
                   cudaStream_t stream) {
  const FaKvAppend a = kv_append(c);
  const FaVariant v = kv_variant(c);
  const FaVariant* var = c.window_left >= 0 ? &v : nullptr;
  const FaKvAppend* add = c.added > 0 ? &a : nullptr;
  if (caller)
    return fa2tune_forward_kvcache_with_workspace(params(c), kv_cache(c), add, c.layout.page,
                                                  var, kD, FA2TUNE_FP16, c.causal, workspace,
                                                  bytes, stream);
  return fa2tune_forward_kvcache(params(c), kv_cache(c), add, c.layout.page, var, kD,
                                 FA2TUNE_FP16, c.causal, stream);
}

const char* config_of(const Call& c) {
  const FaKvAppend a = kv_append(c);
  const FaVariant v = kv_variant(c);
  return fa2tune_config_name_kvcache(params(c), kv_cache(c), c.added > 0 ? &a : nullptr,
                                     c.layout.page, c.window_left >= 0 ? &v : nullptr, kD,
                                     FA2TUNE_FP16, c.causal);
}

size_t workspace_of(const Call& c) {
  const FaKvAppend a = kv_append(c);
  const FaVariant v = kv_variant(c);
  return fa2tune_workspace_size_kvcache(params(c), kv_cache(c), c.added > 0 ? &a : nullptr,
                                        c.layout.page, c.window_left >= 0 ? &v : nullptr, kD,
                                        FA2TUNE_FP16, c.causal);
}

void poison(const Call& c, cudaStream_t stream) {
  CHECK_CUDA(cudaMemsetAsync(c.dout, 0xFF, c.q.size() * 2, stream));  // NaN halves
  CHECK_CUDA(cudaMemsetAsync(c.dlse, 0xFF, size_t(kBatch) * kHeads * c.nq * 4, stream));
}

// The logical caches after this call's append: row r of sequence b at seqlens[b] + r when
// that is inside the capacity (past it: dropped).
void append_on_host(Call& c) {
  for (int b = 0; b < kBatch; ++b)
    for (int r = 0; r < c.added; ++r) {
      const int pos = c.seqlens[b] + r;
      if (pos < 0 || pos >= kCapacity) continue;
      const size_t src = (size_t(b) * c.added + r) * kRowElems;
      const size_t dst = (size_t(b) * kCapacity + pos) * kRowElems;
      std::copy_n(&c.k_new[src], kRowElems, &c.k_log[dst]);
      std::copy_n(&c.v_new[src], kRowElems, &c.v_log[dst]);
    }
}

struct Errors {
  float o = INFINITY, lse = INFINITY;
  long cache_mismatches = -1;
};

// O and LSE against the float32 reference on the logical caches (after the append), and the
// device caches' valid rows against the logical ones, bit for bit.
Errors compare(const Call& c) {
  std::vector<__half> o(c.q.size()), k(c.k_phys.size()), v(c.v_phys.size());
  std::vector<float> lse(size_t(kBatch) * kHeads * c.nq);
  CHECK_CUDA(cudaMemcpy(o.data(), c.dout, o.size() * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(lse.data(), c.dlse, lse.size() * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(k.data(), c.dk, k.size() * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(v.data(), c.dv, v.size() * 2, cudaMemcpyDeviceToHost));
  Errors e{0.f, 0.f, 0};
  const float scale = 1.f / std::sqrt(float(kD));
  std::vector<float> s(kCapacity), acc(kD);
  for (int b = 0; b < kBatch; ++b) {
    const int len = std::min(c.seqlens[b] + c.added, kCapacity);
    for (int j = 0; j < len; ++j) {
      const size_t lg = (size_t(b) * kCapacity + j) * kRowElems, ph = c.layout.at(b, j);
      e.cache_mismatches += std::memcmp(&k[ph], &c.k_log[lg], kRowElems * 2) != 0;
      e.cache_mismatches += std::memcmp(&v[ph], &c.v_log[lg], kRowElems * 2) != 0;
    }
    for (int h = 0; h < kHeads; ++h) {
      const int g = h / (kHeads / kKvHeads);
      for (int i = 0; i < c.nq; ++i) {
        const __half* qi = &c.q[((size_t(b) * c.nq + i) * kHeads + h) * kD];
        const int pos = i + len - c.nq;  // bottom-right aligned at the sequence's length
        const int hi = c.causal ? std::min(len, pos + 1) : len;
        const int lo = c.window_left >= 0 ? std::max(0, pos - c.window_left) : 0;
        float mx = -INFINITY;
        for (int j = lo; j < hi; ++j) {
          const __half* kj = &c.k_log[(size_t(b) * kCapacity + j) * kRowElems + g * kD];
          float dot = 0.f;
          for (int d = 0; d < kD; ++d) dot += __half2float(qi[d]) * __half2float(kj[d]);
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        float sum = 0.f;
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int j = lo; j < hi; ++j) {
          const float w = std::exp(s[j] - mx);
          sum += w;
          const __half* vj = &c.v_log[(size_t(b) * kCapacity + j) * kRowElems + g * kD];
          for (int d = 0; d < kD; ++d) acc[d] += w * __half2float(vj[d]);
        }
        // A row that sees no key: O = 0 and LSE = -inf (the kernels' rule).
        const float ref_lse = hi > lo ? mx + std::log(sum) : -INFINITY;
        const size_t at_o = ((size_t(b) * c.nq + i) * kHeads + h) * kD;
        for (int d = 0; d < kD; ++d) {
          const float ref = hi > lo ? acc[d] / sum : 0.f;
          const float err = std::fabs(__half2float(o[at_o + d]) - ref);
          e.o = std::isnan(err) ? INFINITY : std::max(e.o, err);
        }
        const float got = lse[(size_t(b) * kHeads + h) * c.nq + i];
        const float err = std::isinf(ref_lse) && std::isinf(got) && ref_lse == got
                              ? 0.f
                              : std::fabs(got - ref_lse);
        e.lse = std::isnan(err) ? INFINITY : std::max(e.lse, err);
      }
    }
  }
  return e;
}

void report(const Call& c, const char* path, int step, cudaError_t launched,
            cudaStream_t stream) {
  const cudaError_t synced = cudaStreamSynchronize(stream);
  const char* name = config_of(c);
  Errors e;
  if (launched == cudaSuccess && synced == cudaSuccess) e = compare(c);
  const bool cache_kernel = name != nullptr && std::strstr(name, "_kvc") != nullptr &&
                            (c.layout.page == 0) == (std::strstr(name, "_pg") == nullptr);
  const bool ok = launched == cudaSuccess && synced == cudaSuccess && cache_kernel &&
                  e.o <= 1e-2f && e.lse <= 1e-2f && e.cache_mismatches == 0;
  failures += ok ? 0 : 1;
  std::printf("%s kvcache %s %s step=%d page=%d nq=%d added=%d causal=%d window=%d config=%s "
              "max_err_o=%.3g max_err_lse=%.3g cache_mismatches=%ld%s%s\n",
              ok ? "PASS" : "FAIL", c.what, path, step, c.layout.page, c.nq, c.added,
              int(c.causal), c.window_left, name ? name : "(none)", e.o, e.lse,
              e.cache_mismatches, launched != cudaSuccess ? " launch=" : "",
              launched != cudaSuccess ? cudaGetErrorString(launched)
                                      : (synced != cudaSuccess ? cudaGetErrorString(synced) : ""));
  std::fflush(stdout);
}

// A zero-filled caller workspace for c (nullptr when it needs none).
void* workspace_for(const Call& c, size_t* bytes) {
  *bytes = workspace_of(c);
  void* ws = nullptr;
  if (*bytes > 0) {
    CHECK_CUDA(cudaMalloc(&ws, *bytes));
    CHECK_CUDA(cudaMemset(ws, 0, *bytes));
  }
  return ws;
}

// One eager call per path (the header's workspace, then the caller's, twice: a counter that
// did not reset would show), each on the first state of the caches.
void eager_case(Call c, cudaStream_t stream) {
  Call expected = c;  // the host state after the append, for the checks
  append_on_host(expected);
  size_t bytes = 0;
  void* ws = workspace_for(c, &bytes);
  const struct { const char* path; bool caller; } paths[] = {
      {"own-workspace", false}, {"caller-workspace", true}, {"caller-workspace-again", true}};
  for (const auto& path : paths) {
    reset(c);
    poison(c, stream);
    const cudaError_t err = launch(c, ws, bytes, path.caller, stream);
    report(expected, path.path, 0, err, stream);
  }
  cudaFree(ws);
}

// A decode step captured once (append one row, attend) and replayed over eight growing
// lengths: between replays only device memory changes (the lengths and the new rows).
void graph_case(Call c, bool caller, cudaStream_t stream) {
  size_t bytes = 0;
  void* ws = caller ? workspace_for(c, &bytes) : nullptr;
  if (!caller) {  // the header's workspace is allocated by a first launch, never in a capture
    reset(c);
    CHECK_CUDA(launch(c, ws, bytes, false, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
  }
  reset(c);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaError_t err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (err == cudaSuccess) {
    const cudaError_t launched = launch(c, ws, bytes, caller, stream);
    err = cudaStreamEndCapture(stream, &graph);
    if (launched != cudaSuccess) err = launched;
  }
  if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
  std::mt19937 rng(99);
  const char* path = caller ? "graph-caller-workspace" : "graph-own-workspace";
  for (int step = 0; step < 8; ++step) {
    if (step > 0) {  // the last step's rows are cached now; new rows for this one
      append_on_host(c);
      for (int& len : c.seqlens) len += c.added;
      c.k_new = randoms(c.k_new.size(), rng);
      c.v_new = randoms(c.v_new.size(), rng);
      CHECK_CUDA(cudaMemcpyAsync(c.dseqlens, c.seqlens.data(), c.seqlens.size() * 4,
                                 cudaMemcpyHostToDevice, stream));
      CHECK_CUDA(cudaMemcpyAsync(c.dk_new, c.k_new.data(), c.k_new.size() * 2,
                                 cudaMemcpyHostToDevice, stream));
      CHECK_CUDA(cudaMemcpyAsync(c.dv_new, c.v_new.data(), c.v_new.size() * 2,
                                 cudaMemcpyHostToDevice, stream));
    }
    poison(c, stream);
    Call expected = c;
    append_on_host(expected);
    report(expected, path, step, err == cudaSuccess ? cudaGraphLaunch(exec, stream) : err,
           stream);
  }
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaGetLastError();  // a failed capture's error is reported above
  cudaFree(ws);
}

void expect(const char* what, cudaError_t got, cudaError_t want) {
  const bool ok = got == want;
  failures += ok ? 0 : 1;
  std::printf("%s kvcache refusal %s -> %s\n", ok ? "PASS" : "FAIL", what,
              cudaGetErrorString(got));
}

// Refused calls: page sizes not built, a block table missing or too narrow, a workspace too
// small (refused before the append: the cache stays as it was), a variant not exported.
void refusals(Call c, cudaStream_t stream) {
  reset(c);
  const FaParams p = params(c);
  const FaKvAppend a = kv_append(c);
  FaKvCache kc = kv_cache(c);
  expect("page 32 (not exported)",
         fa2tune_forward_kvcache(p, kc, &a, 32, nullptr, kD, FA2TUNE_FP16, false, stream),
         cudaErrorInvalidValue);
  FaKvCache narrow = kc;
  narrow.table_stride = kPagesPerSeq - 1;
  expect("table_stride < capacity / page",
         fa2tune_forward_kvcache(p, narrow, &a, kPage, nullptr, kD, FA2TUNE_FP16, false, stream),
         cudaErrorInvalidValue);
  FaKvCache no_table = kc;
  no_table.block_table = nullptr;
  expect("paged without a block table",
         fa2tune_forward_kvcache(p, no_table, &a, kPage, nullptr, kD, FA2TUNE_FP16, false,
                                 stream),
         cudaErrorInvalidValue);
  FaKvCache no_lengths = kc;
  no_lengths.seqlens = nullptr;
  expect("null seqlens",
         fa2tune_forward_kvcache(p, no_lengths, &a, kPage, nullptr, kD, FA2TUNE_FP16, false,
                                 stream),
         cudaErrorInvalidValue);
  const FaVariant cap{-1, -1, 0, 30.f, nullptr};
  expect("softcap (not exported)",
         fa2tune_forward_kvcache(p, kc, &a, kPage, &cap, kD, FA2TUNE_FP16, false, stream),
         cudaErrorNotSupported);
  const size_t need = workspace_of(c);
  void* small = nullptr;
  CHECK_CUDA(cudaMalloc(&small, 256));
  expect("workspace one byte short",
         need > 0 ? fa2tune_forward_kvcache_with_workspace(p, kc, &a, kPage, nullptr, kD,
                                                           FA2TUNE_FP16, false, small, need - 1,
                                                           stream)
                  : cudaErrorInvalidValue,
         cudaErrorInvalidValue);
  cudaFree(small);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  // Nothing was launched: the cache holds what it held (the refused append wrote nothing).
  std::vector<__half> k(c.k_phys.size());
  CHECK_CUDA(cudaMemcpy(k.data(), c.dk, k.size() * 2, cudaMemcpyDeviceToHost));
  const bool untouched = std::memcmp(k.data(), c.k_phys.data(), k.size() * 2) == 0;
  failures += untouched ? 0 : 1;
  std::printf("%s kvcache refusal leaves the cache unchanged\n", untouched ? "PASS" : "FAIL");
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, cc %d.%d\n", prop.name, prop.major, prop.minor);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::mt19937 rng(1234);
  struct Spec {
    const char* what;
    bool paged, mapped;
    int nq, added;
    bool causal;
    int window;
  };
  const Spec specs[] = {
      {"paged-decode", true, false, 1, 0, false, -1},
      {"paged-decode-append", true, false, 1, 1, true, -1},  // one causal row: unmasked
      {"paged-spec-append", true, false, 3, 3, true, -1},    // 3 speculative tokens, causal
      {"paged-mapped-append", true, true, 2, 2, false, -1},
      {"paged-window-append", true, false, 1, 1, false, 256},
      {"contiguous-decode", false, false, 1, 0, false, -1},
      {"contiguous-mapped-append", false, true, 2, 2, true, -1},
      {"contiguous-chunk-append", false, false, 16, 16, true, -1},  // a 16-row prefill chunk
  };
  for (const Spec& s : specs) {
    Call c = make_call(s.what, s.paged ? paged(s.mapped, rng) : contiguous(s.mapped, rng), s.nq,
                       s.added, s.causal, s.window, rng);
    eager_case(c, stream);
    release(c);
  }
  for (bool paged_cache : {true, false}) {
    for (bool caller : {true, false}) {
      Call c = make_call(paged_cache ? "paged-graph" : "contiguous-graph",
                         paged_cache ? paged(false, rng) : contiguous(false, rng), 1, 1, false,
                         -1, rng);
      graph_case(c, caller, stream);
      release(c);
    }
  }
  {
    Call c = make_call("refusals", paged(false, rng), 1, 1, false, -1, rng);
    refusals(c, stream);
    release(c);
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("kvcache probe: %d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
