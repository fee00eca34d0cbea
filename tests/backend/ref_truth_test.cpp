// Truth tests of the reference backend against definitions written out independently here
// (explicit matrices, naive formulas, hand-computed values).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <vector>

#include "backend/ref/ops.h"
#include "op_test_util.h"
#include "util/half.h"

using namespace bonsai;
using namespace bonsai::test;

// ---- Hadamard ----------------------------------------------------------------------------------

TEST(RefHadamard, BasisVectorGivesSylvesterRow) {
  for (int64_t n : {1, 2, 8, 64, 1024}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t c = 0; c < n; c += (n > 64 ? 37 : 1)) {
      std::fill(x.begin(), x.end(), 0.0f);
      x[size_t(c)] = 1.0f;
      ref::hadamard_forward(x.data(), 1, n, nullptr, n);
      const double inv = 1.0 / std::sqrt(double(n));
      for (int64_t r = 0; r < n; ++r) {
        const double want = (std::popcount(uint64_t(r & c)) % 2 ? -1.0 : 1.0) * inv;
        ASSERT_NEAR(x[size_t(r)], want, 1e-7) << "n " << n << " r " << r << " c " << c;
      }
    }
  }
}

TEST(RefHadamard, MatchesExplicitMatrixWithSigns) {
  const int64_t n = 256, K = 512;  // two blocks
  auto x = randn(size_t(2 * K), 11);
  auto s = random_signs(size_t(K), 12);
  auto fwd = x, inv = x;
  ref::hadamard_forward(fwd.data(), 2, K, s.data(), n);
  ref::hadamard_inverse(inv.data(), 2, K, s.data(), n);
  for (int64_t row = 0; row < 2; ++row)
    for (int64_t b0 = 0; b0 < K; b0 += n)
      for (int64_t r = 0; r < n; ++r) {
        double f = 0.0, g = 0.0;  // f = (H S x)_r / sqrt(n); g = s_r (H x)_r / sqrt(n)
        for (int64_t c = 0; c < n; ++c) {
          const double h = std::popcount(uint64_t(r & c)) % 2 ? -1.0 : 1.0;
          const double xc = x[size_t(row * K + b0 + c)];
          f += h * s[size_t(b0 + c)] * xc;
          g += h * xc;
        }
        f /= std::sqrt(double(n));
        g = g / std::sqrt(double(n)) * s[size_t(b0 + r)];
        ASSERT_NEAR(fwd[size_t(row * K + b0 + r)], f, 1e-5);
        ASSERT_NEAR(inv[size_t(row * K + b0 + r)], g, 1e-5);
      }
}

TEST(RefHadamard, ForwardThenInverseIsIdentityAndNormPreserved) {
  const int64_t K = 3072, rows = 3;
  for (int64_t block : {128, 1024}) {
    auto x = randn(size_t(rows * K), 21);
    auto s = random_signs(size_t(K), 22);
    auto y = x;
    ref::hadamard_forward(y.data(), rows, K, s.data(), block);
    for (int64_t r = 0; r < rows; ++r) {
      double nx = 0, ny = 0;
      for (int64_t i = 0; i < K; ++i) {
        nx += double(x[size_t(r * K + i)]) * x[size_t(r * K + i)];
        ny += double(y[size_t(r * K + i)]) * y[size_t(r * K + i)];
      }
      EXPECT_NEAR(ny / nx, 1.0, 1e-6);
    }
    ref::hadamard_inverse(y.data(), rows, K, s.data(), block);  // R^T = S H / sqrt(n): transform, then sign
    EXPECT_CLOSE(y, x, 1e-6);
  }
}

TEST(RefHadamard, RejectsBadBlock) {
  std::vector<float> x(96, 1.0f);
  EXPECT_ANY_THROW(ref::hadamard_forward(x.data(), 1, 96, nullptr, 3 * 32));
  EXPECT_ANY_THROW(ref::hadamard_forward(x.data(), 1, 96, nullptr, 64));
}

// ---- Ternary -------------------------------------------------------------------------------------

TEST(RefTernary, MatmulEqualsExplicitDequantisedMatmul) {
  const int64_t N = 37, K = 384, M = 5;
  auto W = random_ternary(N, K, 31, /*p3=*/0.01);
  auto x = randn(size_t(M * K), 32);
  // Explicit dequantisation from the layout: element e of row n at bits 2(e%16) of word e/16.
  std::vector<double> Wd(size_t(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < K; ++e) {
      const uint32_t word = W.words[size_t(n * K / 16 + e / 16)];
      const int code = int((word >> (2 * (e % 16))) & 3);
      Wd[size_t(n * K + e)] = (code - 1) * double(fp16_to_f32(W.scales[size_t(n * K / 128 + e / 128)]));
    }
  auto y = poisoned(size_t(M * N));
  ref::ternary_matmul(W.blocks.data(), N, K, x.data(), M, y.data());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t e = 0; e < K; ++e) acc += Wd[size_t(n * K + e)] * x[size_t(m * K + e)];
      ASSERT_EQ(y[size_t(m * N + n)], float(acc)) << m << "," << n;
    }
  auto row = poisoned(size_t(K));
  ref::ternary_dequant_row(W.blocks.data(), K, 17, row.data());
  for (int64_t e = 0; e < K; ++e) ASSERT_EQ(row[size_t(e)], float(Wd[size_t(17 * K + e)]));
}

// ---- Norms, RoPE, elementwise -------------------------------------------------------------------

TEST(RefDense, F32KnownValues) {
  // w [3, 2], x [2, 2]: y = x w^T.
  const float w[6] = {1, 2, 3, 4, -1, 0.5f}, x[4] = {1, 1, 2, -1};
  float y[6];
  ref::dense_matmul_f32(w, 3, 2, x, 2, y);
  const float want[6] = {3, 7, -0.5f, 0, 2, -2.5f};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y[i], want[i]) << i;
}

TEST(RefNorm, KnownValues) {
  const float x[2] = {3.0f, 4.0f}, gain[2] = {2.0f, 0.5f};
  float out[2];
  ref::rmsnorm(x, 1, 2, gain, 0.0f, out);  // rms = sqrt(12.5)
  EXPECT_FLOAT_EQ(out[0], float(3.0 / std::sqrt(12.5) * 2.0));
  EXPECT_FLOAT_EQ(out[1], float(4.0 / std::sqrt(12.5) * 0.5));
  float y[2] = {3.0f, 4.0f};
  ref::l2norm_heads(y, 1, 2, 0.0f);
  EXPECT_FLOAT_EQ(y[0], 0.6f);
  EXPECT_FLOAT_EQ(y[1], 0.8f);
  const float z[2] = {0.0f, 1.0f};
  ref::gated_rmsnorm(x, z, gain, 1, 2, 0.0f, out);  // silu(0) = 0, silu(1) = 1/(1+e^-1)
  EXPECT_FLOAT_EQ(out[0], 0.0f);
  EXPECT_FLOAT_EQ(out[1], float(4.0 / std::sqrt(12.5) * 0.5 / (1.0 + std::exp(-1.0))));
}

TEST(RefRope, RotatesKnownVector) {
  // head_dim 8, rot_dims 4, pos 3, theta 10000: pair (0, 2) at angle 3, pair (1, 3) at 3 * 10000^-0.5.
  float x[16] = {1, 2, 3, 4, 5, 6, 7, 8, -1, -2, -3, -4, -5, -6, -7, -8};
  float orig[16];
  std::copy(x, x + 16, orig);
  ref::rope_neox(x, 2, 8, 4, 3, 10000.0f);
  for (int h = 0; h < 2; ++h) {
    const float* o = orig + 8 * h;
    const float* r = x + 8 * h;
    const double a0 = 3.0, a1 = 3.0 * 0.01;
    EXPECT_NEAR(r[0], o[0] * std::cos(a0) - o[2] * std::sin(a0), 1e-6);
    EXPECT_NEAR(r[2], o[0] * std::sin(a0) + o[2] * std::cos(a0), 1e-6);
    EXPECT_NEAR(r[1], o[1] * std::cos(a1) - o[3] * std::sin(a1), 1e-6);
    EXPECT_NEAR(r[3], o[1] * std::sin(a1) + o[3] * std::cos(a1), 1e-6);
    for (int i = 4; i < 8; ++i) EXPECT_EQ(r[i], o[i]);  // beyond rot_dims: untouched
  }
  float y[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  ref::rope_neox(y, 1, 8, 8, 0, 1e7f);  // position 0 is the identity
  for (int i = 0; i < 8; ++i) EXPECT_EQ(y[i], float(i + 1));
}

TEST(RefElementwise, KnownValues) {
  float x[3] = {2.0f, 2.0f, -4.0f};
  const float gate[3] = {0.0f, 100.0f, -100.0f};
  ref::sigmoid_gate_mul(x, gate, 3);
  EXPECT_FLOAT_EQ(x[0], 1.0f);
  EXPECT_FLOAT_EQ(x[1], 2.0f);
  EXPECT_NEAR(x[2], 0.0f, 1e-30);
  const float g[2] = {0.0f, 1.0f}, up[2] = {5.0f, 3.0f};
  float o[2];
  ref::silu_mul(g, up, 2, o);
  EXPECT_FLOAT_EQ(o[0], 0.0f);
  EXPECT_FLOAT_EQ(o[1], float(3.0 / (1.0 + std::exp(-1.0))));
  const float v[6] = {NAN, 1.0f, 3.0f, -2.0f, 3.0f, NAN};
  EXPECT_EQ(ref::argmax(v, 6), 2);  // tie at 2 and 4: lowest index; NaN never wins
  const float nan2[2] = {NAN, NAN};
  EXPECT_EQ(ref::argmax(nan2, 2), 0);
}

// ---- Attention ----------------------------------------------------------------------------------

TEST(RefAttention, HandComputed) {
  // One head, D = 1, q = 1, keys 0 and ln 3, scale 1: weights 1/4, 3/4; values 4, 8 -> 7.
  const float q[1] = {1.0f}, k[2] = {0.0f, float(std::log(3.0))}, v[2] = {4.0f, 8.0f};
  float out[1];
  ref::attention_decode(q, k, v, 2, 1, 1, 1, 1.0f, out);
  EXPECT_NEAR(out[0], 7.0f, 1e-6);
}

TEST(RefAttention, MatchesNaiveSoftmaxWithGqaAndCausalMask) {
  const int64_t M = 5, p0 = 8, T = p0 + M, Hq = 6, Hkv = 2, D = 40;
  const float scale = 1.0f / std::sqrt(float(D));
  auto q = randn(size_t(M * Hq * D), 41), k = randn(size_t(T * Hkv * D), 42), v = randn(size_t(T * Hkv * D), 43);
  auto out = poisoned(size_t(M * Hq * D));
  ref::attention_prefill(q.data(), k.data(), v.data(), M, p0, Hq, Hkv, D, scale, out.data());
  std::vector<float> want(out.size());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h / (Hq / Hkv), nv = p0 + m + 1;
      std::vector<double> w(static_cast<size_t>(nv));
      double z = 0;
      for (int64_t t = 0; t < nv; ++t) {
        double s = 0;
        for (int64_t d = 0; d < D; ++d) s += double(q[size_t((m * Hq + h) * D + d)]) * k[size_t((t * Hkv + kvh) * D + d)];
        z += (w[size_t(t)] = std::exp(s * scale));  // no max shift: scores are small here
      }
      for (int64_t d = 0; d < D; ++d) {
        double acc = 0;
        for (int64_t t = 0; t < nv; ++t) acc += w[size_t(t)] / z * v[size_t((t * Hkv + kvh) * D + d)];
        want[size_t((m * Hq + h) * D + d)] = float(acc);
      }
    }
  EXPECT_CLOSE(out, want, 1e-6);
  // The last prefill row equals a decode over all T positions.
  auto dec = poisoned(size_t(Hq * D));
  ref::attention_decode(q.data() + (M - 1) * Hq * D, k.data(), v.data(), T, Hq, Hkv, D, scale, dec.data());
  std::vector<float> last(out.end() - Hq * D, out.end());
  EXPECT_CLOSE(dec, last, 1e-7);
}

// ---- Gated DeltaNet -----------------------------------------------------------------------------

TEST(RefGdn, ConvKnownValuesAndStateShift) {
  // C = 1, Kc = 4, taps [1, 2, 3, 4] (tap 3 = current input), state [10, 20, 30] (oldest first).
  const float taps[4] = {1, 2, 3, 4};
  float state[3] = {10, 20, 30};
  const float x[2] = {1, 2};
  float out[2];
  ref::gdn_conv(x, state, taps, 2, 1, 4, out);
  auto silu = [](double z) { return z / (1 + std::exp(-z)); };
  EXPECT_FLOAT_EQ(out[0], float(silu(1 * 10 + 2 * 20 + 3 * 30 + 4 * 1)));
  EXPECT_FLOAT_EQ(out[1], float(silu(1 * 20 + 2 * 30 + 3 * 1 + 4 * 2)));
  EXPECT_EQ(state[0], 30.0f);  // the last 3 inputs: 30, 1, 2
  EXPECT_EQ(state[1], 1.0f);
  EXPECT_EQ(state[2], 2.0f);
}

TEST(RefGdn, GatesKnownValues) {
  const float a[3] = {0.0f, 30.0f, -1.0f}, b[3] = {0.0f, 2.0f, -2.0f};
  // A = -exp(A_log) for A_log = 0, log 2, 0.5.
  const float A[3] = {-1.0f, -2.0f, -float(std::exp(0.5))}, dt_bias[3] = {0.0f, 0.0f, 1.0f};
  float g[3], beta[3];
  ref::gdn_gates(a, b, A, dt_bias, 1, 3, g, beta);
  EXPECT_FLOAT_EQ(g[0], -float(std::log(2.0)));  // -1 * softplus(0)
  EXPECT_FLOAT_EQ(g[1], -60.0f);                 // softplus(30) = 30 above the threshold
  EXPECT_FLOAT_EQ(g[2], -float(std::exp(0.5) * std::log(2.0)));
  EXPECT_FLOAT_EQ(beta[0], 0.5f);
  EXPECT_FLOAT_EQ(beta[1], float(1 / (1 + std::exp(-2.0))));
}

TEST(RefGdn, OneTokenFromZeroState) {
  // S = 0: kv = 0, delta = beta v, S = k (beta v)^T, o = S^T q = beta (k . q) v.
  const int64_t Dk = 4, Dv = 3;
  const float q[4] = {0.5f, 0.5f, 0.5f, 0.5f}, k[4] = {1, 0, 0, 0}, v[3] = {1, 2, 3};
  const float g[1] = {-0.3f}, beta[1] = {0.25f};
  std::vector<float> S(size_t(Dk * Dv), 0.0f);
  float out[3];
  ref::gdn_recurrent(S.data(), q, k, v, g, beta, 1, 1, 1, Dk, Dv, out);
  for (int j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(out[j], 0.25f * 0.5f * v[j]);
  for (int j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(S[size_t(j)], 0.25f * v[j]);
  for (int64_t i = Dv; i < Dk * Dv; ++i) EXPECT_EQ(S[size_t(i)], 0.0f);
}

TEST(RefGdn, ChunkedEqualsRecurrent) {
  auto c = make_gdn_case(150, 2, 6, 32, 24, 51);  // 150 = 2*64 + 22 = 9*16 + 6: ragged tails
  auto s_rec = c.state;
  auto o_rec = poisoned(size_t(c.T * c.Nv * c.Dv));
  ref::gdn_recurrent(s_rec.data(), c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), c.T, c.Nk, c.Nv,
                     c.Dk, c.Dv, o_rec.data());
  for (int64_t chunk : {1, 16, 64, 150, 200}) {
    auto s = c.state;
    auto o = poisoned(o_rec.size());
    ref::gdn_chunked(s.data(), c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), c.T, c.Nk, c.Nv,
                     c.Dk, c.Dv, o.data(), chunk);
    SCOPED_TRACE(chunk);
    EXPECT_CLOSE(o, o_rec, 1e-6);
    EXPECT_CLOSE(s, s_rec, 1e-6);
  }
}
