// CPU RoPE, gates, SwiGLU and argmax.
#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"
#include "backend/cpu/scratch.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/vec.h"
#include "util/error.h"

namespace bonsai::cpu {
namespace {
constexpr int64_t kElemGrain = 16384;  // elementwise work below this runs on the caller
}  // namespace

void rope_neox(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dims, int64_t pos, float theta) {
  if (rot_dims % 2 != 0 || rot_dims > head_dim) fail("rope_neox: rot_dims {} vs head_dim {}", rot_dims, head_dim);
  const int64_t half = rot_dims / 2;
  // The angle is computed in double: pos * freq in fp32 loses ~pos * 6e-8 rad, 0.016 rad at pos 262144.
  // The cos/sin table is per call (rot_dims/2 entries) and shared by every head.
  float* cs = scratch(size_t(rot_dims), 3);
  float* sn = cs + half;
  for (int64_t i = 0; i < half; ++i) {
    const double angle = double(pos) * std::pow(double(theta), -2.0 * double(i) / double(rot_dims));
    cs[i] = float(std::cos(angle));
    sn[i] = float(std::sin(angle));
  }
  for (int64_t h = 0; h < n_heads; ++h) {
    float* a = x + h * head_dim;
    float* b = a + half;
    for (int64_t i = 0; i < half; ++i) {
      const float xa = a[i], xb = b[i];
      a[i] = xa * cs[i] - xb * sn[i];
      b[i] = xa * sn[i] + xb * cs[i];
    }
  }
}

void sigmoid_gate_mul(float* x, const float* gate, int64_t n) {
  parallel_for(0, n, kElemGrain, [&](int64_t lo, int64_t hi) { vec::sigmoid_mul(x + lo, gate + lo, hi - lo); });
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  parallel_for(0, n, kElemGrain, [&](int64_t lo, int64_t hi) { vec::silu_mul(gate + lo, up + lo, hi - lo, out + lo); });
}

int64_t argmax(const float* x, int64_t n) {
  // Fixed slices (not the pool's chunks) so each slice's winner has a home; slices are combined in
  // index order, so the lowest index still wins ties.
  constexpr int64_t kSlices = 64;
  const int64_t slice = std::max<int64_t>(65536, (n + kSlices - 1) / kSlices);
  const int64_t ns = (n + slice - 1) / slice;
  int64_t best[kSlices];
  parallel_for(0, ns, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t s = lo; s < hi; ++s) {
      const int64_t e = std::min(n, (s + 1) * slice);
      int64_t b = -1;
      for (int64_t i = s * slice; i < e; ++i)
        if (!std::isnan(x[i]) && (b < 0 || x[i] > x[b])) b = i;
      best[s] = b;
    }
  });
  int64_t b = -1;
  for (int64_t s = 0; s < ns; ++s)
    if (best[s] >= 0 && (b < 0 || x[best[s]] > x[b])) b = best[s];
  return b < 0 ? 0 : b;
}

}  // namespace bonsai::cpu
