// CPU normalisations: fp32 with 8 partial sums per row, threaded over rows when there is enough work.
#include <algorithm>
#include <cmath>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/vec.h"

namespace bonsai::cpu {
namespace {

inline float sum_squares(const float* x, int64_t n) { return kernels().dot(x, x, n); }
// Rows per chunk so that a chunk holds ~32K elements.
inline int64_t grain_rows(int64_t n) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, n)); }

}  // namespace

void rmsnorm(const float* x, int64_t rows, int64_t n, const float* gain, float eps, float* out) {
  parallel_for(0, rows, grain_rows(n), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = x + r * n;
      float* o = out + r * n;
      const float inv = 1.0f / std::sqrt(sum_squares(xr, n) / float(n) + eps);
      if (gain)
        for (int64_t i = 0; i < n; ++i) o[i] = xr[i] * inv * gain[i];
      else
        for (int64_t i = 0; i < n; ++i) o[i] = xr[i] * inv;
    }
  });
}

void add_rmsnorm(float* h, const float* delta, int64_t rows, int64_t n, const float* gain, float eps, float* out) {
  parallel_for(0, rows, grain_rows(n), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      float* hr = h + r * n;
      const float* dr = delta + r * n;
      for (int64_t i = 0; i < n; ++i) hr[i] += dr[i];
      const float inv = 1.0f / std::sqrt(sum_squares(hr, n) / float(n) + eps);
      float* o = out + r * n;
      for (int64_t i = 0; i < n; ++i) o[i] = hr[i] * inv * (gain ? gain[i] : 1.0f);
    }
  });
}

void l2norm_heads(float* x, int64_t rows, int64_t head_dim, float eps) {
  parallel_for(0, rows, grain_rows(head_dim), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      float* xr = x + r * head_dim;
      const float inv = 1.0f / std::sqrt(sum_squares(xr, head_dim) + eps);
      for (int64_t i = 0; i < head_dim; ++i) xr[i] *= inv;
    }
  });
}

void gated_rmsnorm(const float* o, const float* z, const float* gain, int64_t rows, int64_t Dv, float eps,
                   float* out) {
  parallel_for(0, rows, grain_rows(Dv), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* orow = o + r * Dv;
      const float* zr = z + r * Dv;
      const float inv = 1.0f / std::sqrt(sum_squares(orow, Dv) / float(Dv) + eps);
      float* out_r = out + r * Dv;
      // silu(z) first (vectorised; out may alias o but not z), then the norm in place.
      float sz[512];
      for (int64_t i0 = 0; i0 < Dv; i0 += 512) {
        const int64_t len = std::min<int64_t>(512, Dv - i0);
        std::copy(zr + i0, zr + i0 + len, sz);
        vec::silu(sz, len);
        for (int64_t i = 0; i < len; ++i) out_r[i0 + i] = orow[i0 + i] * inv * gain[i0 + i] * sz[i];
      }
    }
  });
}

}  // namespace bonsai::cpu
