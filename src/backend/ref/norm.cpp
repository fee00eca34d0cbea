// Reference normalisations, in double.
#include <cmath>

#include "backend/ref/ops.h"

namespace bonsai::ref {
namespace {
double silu(double z) { return z / (1.0 + std::exp(-z)); }
}  // namespace

void rmsnorm(const float* x, int64_t rows, int64_t n, const float* gain, float eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * double(xr[i]);
    const double inv = 1.0 / std::sqrt(ss / double(n) + double(eps));
    for (int64_t i = 0; i < n; ++i) out[r * n + i] = float(double(xr[i]) * inv * (gain ? double(gain[i]) : 1.0));
  }
}

void add_rmsnorm(float* h, const float* delta, int64_t rows, int64_t n, const float* gain, float eps, float* out) {
  for (int64_t i = 0; i < rows * n; ++i) h[i] = h[i] + delta[i];  // the residual stream is fp32
  rmsnorm(h, rows, n, gain, eps, out);
}

void l2norm_heads(float* x, int64_t rows, int64_t head_dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * head_dim;
    double ss = 0.0;
    for (int64_t i = 0; i < head_dim; ++i) ss += double(xr[i]) * double(xr[i]);
    const double inv = 1.0 / std::sqrt(ss + double(eps));
    for (int64_t i = 0; i < head_dim; ++i) xr[i] = float(double(xr[i]) * inv);
  }
}

void gated_rmsnorm(const float* o, const float* z, const float* gain, int64_t rows, int64_t Dv, float eps,
                   float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* orow = o + r * Dv;
    double ss = 0.0;
    for (int64_t i = 0; i < Dv; ++i) ss += double(orow[i]) * double(orow[i]);
    const double inv = 1.0 / std::sqrt(ss / double(Dv) + double(eps));
    for (int64_t i = 0; i < Dv; ++i)
      out[r * Dv + i] = float(double(orow[i]) * inv * double(gain[i]) * silu(double(z[r * Dv + i])));
  }
}

}  // namespace bonsai::ref
