// Per-thread scratch buffers for the CPU ops: they grow to the largest size ever asked for and are
// then reused, so the hot path does not allocate once warmed up. Slots let one op hold several.
#pragma once
#include <cstddef>
#include <vector>

namespace bonsai::cpu {

inline float* scratch(size_t n, int slot = 0) {
  thread_local std::vector<float> bufs[4];
  auto& b = bufs[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

}  // namespace bonsai::cpu
