// Reference RoPE, gates, SwiGLU and argmax, in double.
#include <cmath>

#include "backend/ref/ops.h"
#include "util/error.h"

namespace bonsai::ref {

void rope_neox(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dims, int64_t pos, float theta) {
  if (rot_dims % 2 != 0 || rot_dims > head_dim) fail("rope_neox: rot_dims {} vs head_dim {}", rot_dims, head_dim);
  const int64_t half = rot_dims / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double angle = double(pos) * std::pow(double(theta), -2.0 * double(i) / double(rot_dims));
    const double c = std::cos(angle), s = std::sin(angle);
    for (int64_t h = 0; h < n_heads; ++h) {
      float* xh = x + h * head_dim;
      const double a = xh[i], b = xh[i + half];
      xh[i] = float(a * c - b * s);
      xh[i + half] = float(a * s + b * c);
    }
  }
}

void sigmoid_gate_mul(float* x, const float* gate, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = float(double(x[i]) / (1.0 + std::exp(-double(gate[i]))));
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = float(g / (1.0 + std::exp(-g)) * double(up[i]));
  }
}

int64_t argmax(const float* x, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
  return best < 0 ? 0 : best;
}

}  // namespace bonsai::ref
