// Reference softmax attention (decode and causal prefill), in double.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/ref/ops.h"
#include "util/error.h"

namespace bonsai::ref {
namespace {

// One query head against positions 0..n_visible-1 of kv head kvh.
void attend_one(const float* qh, const float* k_cache, const float* v_cache, int64_t n_visible, int64_t Hkv,
                int64_t kvh, int64_t D, double scale, float* out) {
  std::vector<double> s(static_cast<size_t>(n_visible));
  double mx = -INFINITY;
  for (int64_t t = 0; t < n_visible; ++t) {
    const float* kt = k_cache + (t * Hkv + kvh) * D;
    double dot = 0.0;
    for (int64_t d = 0; d < D; ++d) dot += double(qh[d]) * double(kt[d]);
    s[size_t(t)] = dot * scale;
    mx = std::max(mx, s[size_t(t)]);
  }
  double sum = 0.0;
  for (auto& v : s) sum += (v = std::exp(v - mx));
  for (int64_t d = 0; d < D; ++d) {
    double acc = 0.0;
    for (int64_t t = 0; t < n_visible; ++t) acc += s[size_t(t)] * double(v_cache[(t * Hkv + kvh) * D + d]);
    out[d] = float(acc / sum);
  }
}

void check(int64_t Hq, int64_t Hkv) {
  if (Hkv <= 0 || Hq % Hkv != 0) fail("attention: Hq = {} is not a multiple of Hkv = {}", Hq, Hkv);
}

}  // namespace

void attention_decode(const float* q, const float* k_cache, const float* v_cache, int64_t T, int64_t Hq,
                      int64_t Hkv, int64_t D, float scale, float* out) {
  check(Hq, Hkv);
  const int64_t rep = Hq / Hkv;
  for (int64_t h = 0; h < Hq; ++h) attend_one(q + h * D, k_cache, v_cache, T, Hkv, h / rep, D, scale, out + h * D);
}

void attention_prefill(const float* q, const float* k_cache, const float* v_cache, int64_t M, int64_t p0,
                       int64_t Hq, int64_t Hkv, int64_t D, float scale, float* out) {
  check(Hq, Hkv);
  const int64_t rep = Hq / Hkv;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < Hq; ++h)
      attend_one(q + (m * Hq + h) * D, k_cache, v_cache, p0 + m + 1, Hkv, h / rep, D, scale,
                 out + (m * Hq + h) * D);
}

}  // namespace bonsai::ref
