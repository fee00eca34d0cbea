// Fused activation sites (site.h): norm + rotation and SwiGLU + rotation, one pass per row / block.
#include "backend/cpu/site.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/vec.h"
#include "util/error.h"

namespace bonsai::cpu {
namespace {

void check_block(int64_t n, int64_t block) {
  if (block <= 0 || (block & (block - 1)) != 0) fail("site: block {} is not a power of two", block);
  if (n % block != 0) fail("site: n = {} is not a multiple of block {}", n, block);
}

}  // namespace

void add_rmsnorm_rotate(float* h, const float* delta, int64_t rows, int64_t n, const float* gain, float eps,
                        float* out, float* site, const int8_t* signs, int64_t block) {
  check_block(n, block);
  const Kernels& k = kernels();
  const float scale = float(1.0 / std::sqrt(double(block)));
  // ~32K elements per chunk: one decode row (n = 5120) runs on the caller, no pool dispatch.
  const int64_t grain = std::max<int64_t>(1, 32768 / n);
  parallel_for(0, rows, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      float* hr = h + r * n;
      if (delta) {
        const float* dr = delta + r * n;
        for (int64_t i = 0; i < n; ++i) hr[i] += dr[i];
      }
      const float inv = 1.0f / std::sqrt(k.dot(hr, hr, n) / float(n) + eps);  // as cpu::add_rmsnorm
      float* o = out + r * n;
      float* s = site + r * n;
      for (int64_t i = 0; i < n; ++i) s[i] = o[i] = hr[i] * inv * (gain ? gain[i] : 1.0f);
      // The row (<= 70 KB at the 27B widths) is still in L2: rotate it block by block (each block in L1).
      for (int64_t b0 = 0; b0 < n; b0 += block) k.fwht_block(s + b0, block, signs ? signs + b0 : nullptr, nullptr, scale);
    }
  });
}

void silu_mul_rotate(const float* gate, const float* up, int64_t rows, int64_t n, float* site, const int8_t* signs,
                     int64_t block) {
  check_block(n, block);
  const Kernels& k = kernels();
  const float scale = float(1.0 / std::sqrt(double(block)));
  const int64_t per_row = n / block;
  // Work item = (row, block); ~16K elements per chunk (the 17408-wide decode row: two chunks, both cores).
  const int64_t grain = std::max<int64_t>(1, 16384 / block);
  parallel_for(0, rows * per_row, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t off = (u / per_row) * n + (u % per_row) * block;
      float* s = site + off;
      vec::silu_mul(gate + off, up + off, block, s);  // as cpu::silu_mul
      k.fwht_block(s, block, signs ? signs + off % n : nullptr, nullptr, scale);
    }
  });
}

}  // namespace bonsai::cpu
