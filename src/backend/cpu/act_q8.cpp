// Per-site int8 activation quantisation for the q8 ternary kernels (see act_q8.h, kernels.h).
#include "backend/cpu/act_q8.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"

namespace bonsai::cpu {

ActQ8 quantize_activation(const float* x, int64_t M, int64_t K, int levels) {
  // One buffer: q [M, L, K] (64-byte aligned: the kernels load 64-byte planes), then scale [M, G] and
  // sum [M, L, G].
  thread_local std::vector<uint8_t> buf;
  const int64_t G = K / 128, L = levels;
  const size_t need = size_t(M * L * K + 4 * M * G + 4 * M * L * G + 128);
  if (buf.size() < need) buf.resize(need);
  uint8_t* base = buf.data();
  base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
  int8_t* q = reinterpret_cast<int8_t*>(base);
  float* scale = reinterpret_cast<float*>(base + M * L * K);
  int32_t* sum = reinterpret_cast<int32_t*>(base + M * L * K + 4 * M * G);
  const auto quant = kernels().quantize_q8;
  // ~64K elements per chunk: quantising costs ~1 ns per element, below that threading does not pay.
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / K);
  parallel_for(0, M, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t m = lo; m < hi; ++m) quant(x + m * K, K, levels, q + m * L * K, scale + m * G, sum + m * L * G);
  });
  return {q, scale, sum, levels};
}

}  // namespace bonsai::cpu
