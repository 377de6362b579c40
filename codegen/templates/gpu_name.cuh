// gpu_name.cuh -- the exported header's GPU-name key (fa2tune). Host-only, no CUDA.
//
// The same rule as core/gpu_name.py (normalize_gpu_name), which the store and the service
// use; tests/test_gpu_name.py compiles this file alone and compares the two on a list of
// names. The rule, on bytes: only ASCII letters and digits count; every run of anything else
// is one separator (none at either end); letters are lower-cased; a leading word "nvidia" is
// dropped. "NVIDIA H200", "nvidia-h200" and "H200" all give "h200".
#pragma once

#include <cstddef>
#include <cstring>

namespace fa2tune_detail {

// Writes the key of `in` to `out`, NUL-terminated. The key is never longer than the name, so
// cap >= strlen(in) + 2 always holds all of it; a smaller cap cuts it (never overflows).
inline void normalise_name(const char* in, char* out, std::size_t cap) {
  if (cap == 0) return;
  std::size_t len = 0;
  bool pending_space = false;
  for (const char* c = in; *c != '\0' && len + 2 < cap; ++c) {
    char ch = *c;
    if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
    const bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
    if (!alnum) {
      pending_space = len > 0;  // a separator only between two words
      continue;
    }
    if (pending_space) out[len++] = ' ';
    pending_space = false;
    out[len++] = ch;
  }
  out[len] = '\0';
  if (std::strncmp(out, "nvidia ", 7) == 0) std::memmove(out, out + 7, len - 7 + 1);
  else if (std::strcmp(out, "nvidia") == 0) out[0] = '\0';
}

}  // namespace fa2tune_detail
