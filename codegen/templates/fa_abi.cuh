// fa2tune: what every family's host launcher in the exported header checks before a launch:
// the kernel ABI's rules for FaParams (codegen/templates/fa_params.cuh, docs/architecture.md).
// Pointers are 16-byte aligned and strides multiples of 8 elements (the kernels move 16-byte
// vectors), the GQA groups are whole, and the heads fit grid y (the dispatch slices the batch). Include it after a
// family template has defined FaParams. Header-side only: no kernel build reads it.
#pragma once

#include <cstdint>

namespace fa2tune_abi {

inline bool aligned16(const void* ptr) {
  return (reinterpret_cast<std::uintptr_t>(ptr) & 15u) == 0;
}

inline bool valid(const FaParams& p) {
  if (p.q == nullptr || p.k == nullptr || p.v == nullptr || p.o == nullptr) return false;
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.o)) return false;
  const int64_t strides[] = {p.q_batch_stride, p.q_head_stride, p.q_row_stride,
                             p.k_batch_stride, p.k_head_stride, p.k_row_stride,
                             p.v_batch_stride, p.v_head_stride, p.v_row_stride,
                             p.o_batch_stride, p.o_head_stride, p.o_row_stride};
  for (int64_t s : strides)
    if (s % 8 != 0) return false;
  if (p.batch < 1 || p.q_heads < 1 || p.kv_heads < 1 || p.nq < 1 || p.nk < 0) return false;
  if (p.q_heads % p.kv_heads != 0) return false;
  // Heads go to grid y; a batch past grid z's 65,535 is launched in slices by the dispatch.
  return p.q_heads <= 65535;
}

}  // namespace fa2tune_abi
