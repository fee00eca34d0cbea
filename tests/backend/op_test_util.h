// Shared helpers for the backend op tests: seeded random inputs (never all zeros), NaN poisoning and a
// max-error comparison normalised by the reference's largest magnitude.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/ref/ops.h"
#include "format/ternary_codec.h"
#include "util/half.h"

namespace bonsai::test {

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<float> uniform(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<int8_t> random_signs(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int8_t> s(n);
  for (auto& x : s) x = (rng() & 1) ? 1 : -1;
  return s;
}

inline std::vector<float> poisoned(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }

// A random canonical ternary matrix [N, K]: codes 0..2 (and code 3 with probability p3), fp16 scales in
// the range seen in the real packs.
struct Ternary {
  int64_t N, K;
  std::vector<uint32_t> words;   // [N, K/16]   split form, for the tests' own decoding
  std::vector<uint16_t> scales;  // [N, K/128]
  std::vector<uint8_t> blocks;   // [N, K/128, 34] the same as PQ2_0 blocks: what the ops read
};
inline Ternary random_ternary(int64_t N, int64_t K, uint32_t seed, double p3 = 0.0) {
  std::mt19937 rng(seed);
  Ternary t{N, K, std::vector<uint32_t>(size_t(N * K / 16), 0), std::vector<uint16_t>(size_t(N * K / 128))};
  std::uniform_int_distribution<int> code(0, 2);
  std::bernoulli_distribution three(p3);
  for (int64_t e = 0; e < N * K; ++e) {
    const int q = (p3 > 0 && three(rng)) ? 3 : code(rng);
    t.words[size_t(e / 16)] |= uint32_t(q) << (2 * (e % 16));
  }
  std::uniform_real_distribution<float> sc(0.004f, 0.03f);
  for (auto& s : t.scales) s = f32_to_fp16(sc(rng));
  t.blocks.resize(size_t(N * K / 128 * kPq2Bytes));
  canonical_to_pq2(t.words.data(), t.scales.data(), uint64_t(N), uint64_t(K), t.blocks.data());
  return t;
}

// max |got - want| / max |want|; non-finite got values make it +inf.
inline double max_rel_err(const float* got, const float* want, size_t n) {
  double scale = 0.0, err = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    scale = std::max(scale, std::fabs(double(want[i])));
    err = std::max(err, std::fabs(double(got[i]) - double(want[i])));
  }
  return scale > 0 ? err / scale : err;
}

#define EXPECT_CLOSE(got, want, tol)                                                              \
  do {                                                                                            \
    ASSERT_EQ((got).size(), (want).size());                                                       \
    const double _e = ::bonsai::test::max_rel_err((got).data(), (want).data(), (got).size());     \
    EXPECT_LE(_e, (tol)) << #got " vs " #want;                                                    \
    std::printf("    max rel err %-28s %.3g (tol %.1g)\n", #got, _e, double(tol));                  \
  } while (0)

// Random, realistic GDN inputs: q, k l2-normalised (q also / sqrt(Dk)), g from the real gate formula.
struct GdnCase {
  int64_t T, Nk, Nv, Dk, Dv;
  std::vector<float> q, k, v, g, beta, state;
};
inline GdnCase make_gdn_case(int64_t T, int64_t Nk, int64_t Nv, int64_t Dk, int64_t Dv, uint32_t seed) {
  GdnCase c{T, Nk, Nv, Dk, Dv, randn(size_t(T * Nk * Dk), seed), randn(size_t(T * Nk * Dk), seed + 1),
            randn(size_t(T * Nv * Dv), seed + 2), {}, {}, randn(size_t(Nv * Dk * Dv), seed + 3, 0.1f)};
  ref::l2norm_heads(c.q.data(), T * Nk, Dk);
  ref::l2norm_heads(c.k.data(), T * Nk, Dk);
  for (auto& x : c.q) x *= float(1.0 / std::sqrt(double(Dk)));
  auto a = randn(size_t(T * Nv), seed + 4, 2.0f), b = randn(size_t(T * Nv), seed + 5, 2.0f);
  auto A = uniform(size_t(Nv), seed + 6, -2.0f, 1.0f), dt = randn(size_t(Nv), seed + 7);
  for (auto& x : A) x = -std::exp(x);  // A = -exp(A_log)
  c.g.resize(size_t(T * Nv));
  c.beta.resize(size_t(T * Nv));
  ref::gdn_gates(a.data(), b.data(), A.data(), dt.data(), T, Nv, c.g.data(), c.beta.data());
  return c;
}

}  // namespace bonsai::test
