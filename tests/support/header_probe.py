"""C++ text the host-only header probes share (compiled by the compile-tier tests)."""

from __future__ import annotations

#: ``params(d, nq, nk, b, h, kv)``: a valid contiguous bnhd FaParams whose pointers are never
#: read (host-only probes: nothing launches), for the dispatch's lookups and refusals.
PARAMS_CPP = r"""
static FaParams params(int d, int nq, int nk, int b, int h, int kv) {
  FaParams p{};
  p.o = reinterpret_cast<void*>(std::uintptr_t{1} << 21);
  p.q = p.k = p.v = p.o;
  p.q_row_stride = p.o_row_stride = 1LL * h * d;  // bnhd, contiguous
  p.k_row_stride = p.v_row_stride = 1LL * kv * d;
  p.q_head_stride = p.o_head_stride = p.k_head_stride = p.v_head_stride = d;
  p.q_batch_stride = p.o_batch_stride = 1LL * nq * h * d;
  p.k_batch_stride = p.v_batch_stride = 1LL * nk * kv * d;
  p.batch = b; p.q_heads = h; p.kv_heads = kv; p.nq = nq; p.nk = nk;
  p.softmax_scale = 0.125f;
  return p;
}
"""
