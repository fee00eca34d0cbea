// Every CPU kernel variant (avx512vnni, avx512bw, avx2, portable) against the fp64 reference ops, forced one
// path at a time; a path the CPU cannot run is skipped (GTEST_SKIP), never silently replaced. Odd sizes
// (N = 37 rows: tails of every row tile; K = 384: an odd number of 128-groups, so a half 256-chunk;
// M = 1, 5, 64, 67: below, at and beyond the 32-row activation tile). Outputs are poisoned with NaN first.
//
// Tolerances, max |got - ref| / max |ref| over the output:
//   fwht_block 1e-6; dot 1e-6 (relative to sum |a_i b_i|); fp32 ternary rows 1e-5;
//   quantize_q8 (L = 1, 2, 3 int8 digits): bit-identical to the portable variant, and
//     |x - s (q0 + q1/254 + q2/254^2)| <= s * e_L per element, e_L = 1/2, 1/508, 1/129032 (+ fp32 slack);
//   integer ternary rows vs the reference fed the DEquantised activation: 1e-5 (the kernels are exact
//     integer arithmetic + fp32 scaling);
//   integer ternary rows vs the reference fed the original fp32 activation: every output within the
//     rigorous bound sum_g |d_g| * s_g * e_L * #(nonzero codes of the row in g) (+1e-5 relative), and the
//     max relative error below kDigitBound[L] = 1.5e-2 (q8), 2e-4 (q16), 1e-5 (q24) (measured ~1.1e-2,
//     ~5e-5, ~1e-6 on these small odd shapes, where max |ref| is a small sample).
//   At the 27B widths (DigitsAtModelWidths, printed): q8 RMS error / RMS output ~6.3e-3 (Gaussian),
//     ~5.5e-3 (Hadamard-rotated activations with 40x outlier channels), ~2e-2 (the same outliers
//     un-rotated); q16 ~256x smaller; q24 at the fp32 floor (~1e-7..1e-6).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/act_q8.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/thread_pool.h"
#include "backend/ref/ops.h"
#include "op_test_util.h"

using namespace bonsai;
using namespace bonsai::test;

namespace {

constexpr double kQ8Bound = 1.5e-2;                             // q8 vs the fp32-activation truth
constexpr double kDigitBound[4] = {1e-5, kQ8Bound, 2e-4, 1e-5};  // [levels]; [0] = f32
constexpr double kDigitErr[4] = {0, 0.5, 0.5 / 254, 0.5 / 64516};  // per-element error / s, [levels]

// x = s * (q0 + q1/254 + q2/254^2), un-permuted back to natural order (the inverse of kernels.h's layout).
std::vector<float> dequantize_q8(const int8_t* q, const float* scale, int64_t K, int levels) {
  const int64_t G = K / 128;
  std::vector<float> x(static_cast<size_t>(K));
  for (int64_t e = 0; e < K; ++e) {
    const int64_t g = e / 128, c = g / 2, base = 256 * c, P = (2 * c + 1 < G) ? 64 : 32, local = e - base;
    double v = 0, unit = 1;
    for (int l = 0; l < levels; ++l, unit /= 254) v += unit * q[l * K + base + (local & 3) * P + (local >> 2)];
    x[size_t(e)] = float(double(scale[g]) * v);
  }
  return x;
}

struct Q8Row {
  std::vector<int8_t> q;      // [M, L, K]
  std::vector<float> scale;   // [M, G]
  std::vector<int32_t> sum;   // [M, L, G]
};
Q8Row quantize_rows(const cpu::Kernels& k, const float* x, int64_t M, int64_t K, int levels) {
  const int64_t G = K / 128, L = levels;
  Q8Row r{std::vector<int8_t>(size_t(M * L * K), int8_t(0x5a)), std::vector<float>(size_t(M * G), NAN),
          std::vector<int32_t>(size_t(M * L * G), 0x7fffffff)};
  for (int64_t m = 0; m < M; ++m)
    k.quantize_q8(x + m * K, K, levels, r.q.data() + m * L * K, r.scale.data() + m * G, r.sum.data() + m * L * G);
  return r;
}

// The rigorous per-output bound of the digit rounding: |y - y_q| <= sum_g |d_g| * s_g * e * nnz_g, with e the
// per-element error in units of s (plus the fp32 rounding of x * 127/amax: |v| 2^-23 <= 127 * 2^-23).
std::vector<double> q8_bound(const Ternary& W, const std::vector<float>& scale, int64_t M, int levels) {
  const int64_t K = W.K, G = K / 128;
  const double e = kDigitErr[levels] + 127.0 * std::ldexp(1.0, -23);
  std::vector<double> b(size_t(M * W.N), 0.0);
  for (int64_t n = 0; n < W.N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      int nnz = 0;
      for (int64_t e2 = 128 * g; e2 < 128 * g + 128; ++e2)
        nnz += ((W.words[size_t((n * K + e2) / 16)] >> (2 * (e2 % 16))) & 3u) != 1u;
      const double d = std::fabs(double(fp16_to_f32(W.scales[size_t(n * G + g)])));
      for (int64_t m = 0; m < M; ++m) b[size_t(m * W.N + n)] += d * double(scale[size_t(m * G + g)]) * e * nnz;
    }
  return b;
}

class Variant : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    prev_kernels_ = cpu::kernels_name();
    prev_act_ = cpu::ternary_activation();
    k_ = cpu::find_kernels(GetParam());
    if (!k_) GTEST_SKIP() << "this CPU cannot run the " << GetParam() << " kernels";
    ASSERT_STREQ(k_->name, GetParam());
  }
  void TearDown() override {  // restore what the process chose (BONSAI_CPU_KERNELS / BONSAI_CPU_ACT)
    cpu::set_kernels(prev_kernels_.c_str());
    cpu::set_ternary_activation(prev_act_);
    cpu::set_num_threads(0);
  }
  std::string prev_kernels_;
  cpu::TernaryActivation prev_act_{};
  const cpu::Kernels* k_ = nullptr;
};

TEST_P(Variant, FwhtBlock) {
  for (int64_t n : {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048}) {
    const auto x = randn(size_t(n), 10 + uint32_t(n));
    const auto s = random_signs(size_t(n), 20 + uint32_t(n));
    const float scale = float(1.0 / std::sqrt(double(n)));
    for (int mode = 0; mode < 3; ++mode) {  // no signs, pre (forward), post (inverse)
      auto want = x, got = x;
      if (mode == 2)
        ref::hadamard_inverse(want.data(), 1, n, s.data(), n);
      else
        ref::hadamard_forward(want.data(), 1, n, mode == 1 ? s.data() : nullptr, n);
      k_->fwht_block(got.data(), n, mode == 1 ? s.data() : nullptr, mode == 2 ? s.data() : nullptr, scale);
      SCOPED_TRACE(testing::Message() << "n " << n << " mode " << mode);
      EXPECT_LE(max_rel_err(got.data(), want.data(), size_t(n)), 1e-6);
    }
  }
}

TEST_P(Variant, Dot) {
  for (int64_t n : {1, 7, 16, 33, 100, 1000, 5120, 17408}) {
    const auto a = randn(size_t(n), 30), b = randn(size_t(n), 31);
    double want = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) {
      want += double(a[size_t(i)]) * b[size_t(i)];
      mag += std::fabs(double(a[size_t(i)]) * b[size_t(i)]);
    }
    EXPECT_LE(std::fabs(k_->dot(a.data(), b.data(), n) - want) / mag, 1e-6) << "n " << n;
  }
}

TEST_P(Variant, TernaryRowsF32) {
  for (auto [N, K] : {std::pair<int64_t, int64_t>{37, 384}, {37, 128}, {9, 1152}, {6, 5120}}) {
    const auto W = random_ternary(N, K, 40 + uint32_t(K), /*p3=*/0.002);  // code 3 must decode as +2d
    for (int64_t M : {1, 5, 64, 67}) {
      const auto x = randn(size_t(M * K), 41 + uint32_t(M));
      std::vector<float> want(size_t(M * N));
      ref::ternary_matmul(W.blocks.data(), N, K, x.data(), M, want.data());
      // Rows [n0, N) written at y[m * N + n]: the kernels see a row range not starting at 0.
      const int64_t n0 = 3;
      auto got = poisoned(size_t(M * N));
      for (int64_t n = 0; n < n0; ++n)
        for (int64_t m = 0; m < M; ++m) got[size_t(m * N + n)] = want[size_t(m * N + n)];
      if (M == 1)
        k_->ternary_rows_x1(W.blocks.data(), K, n0, N, x.data(), got.data() + n0);
      else
        k_->ternary_rows_xm(W.blocks.data(), K, n0, N, x.data(), M, got.data() + n0, N);
      SCOPED_TRACE(testing::Message() << "N " << N << " K " << K << " M " << M);
      EXPECT_LE(max_rel_err(got.data(), want.data(), got.size()), 1e-5);
    }
  }
}

TEST_P(Variant, QuantizeQ8BitIdenticalToPortable) {
  const cpu::Kernels& p = cpu::portable_kernels();
  for (int levels : {1, 2, 3})
    for (int64_t K : {128, 384, 1024, 5120, 17408}) {
      SCOPED_TRACE(testing::Message() << "levels " << levels << " K " << K);
      auto x = randn(size_t(K), 50 + uint32_t(K));
      for (int64_t e = 0; e < 128; ++e) x[size_t(e)] = 0.0f;  // an all-zero group: s = 0, q = 0
      if (K > 200) x[200] = 37.5f;                            // an outlier group
      const auto a = quantize_rows(*k_, x.data(), 1, K, levels), b = quantize_rows(p, x.data(), 1, K, levels);
      EXPECT_EQ(0, std::memcmp(a.q.data(), b.q.data(), a.q.size()));
      EXPECT_EQ(0, std::memcmp(a.scale.data(), b.scale.data(), 4 * a.scale.size()));
      EXPECT_EQ(a.sum, b.sum);
      // The layout round-trips within the digit error, and the sums are the digits' sums.
      const auto back = dequantize_q8(a.q.data(), a.scale.data(), K, levels);
      for (int64_t e = 0; e < K; ++e) {
        const double s = a.scale[size_t(e / 128)];
        // + the fp32 roundings of 127/amax, x * inv, amax/127 and of the float `back` (a few 2^-24 each).
        const double slack = 3e-7 * (std::fabs(double(x[size_t(e)])) + 127 * s);
        ASSERT_LE(std::fabs(double(back[size_t(e)]) - x[size_t(e)]), s * kDigitErr[levels] * 1.0001 + slack + 1e-30)
            << "e " << e;
      }
      const int64_t G = K / 128;
      for (int l = 0; l < levels; ++l)
        for (int64_t g = 0; g < G; ++g) {
          int32_t sum = 0;
          const int64_t c = g / 2, P = (2 * c + 1 < G) ? 64 : 32;
          for (int t = 0; t < 4; ++t)  // the group's bytes: plane t, bytes (g & 1) * 32 .. + 31 of its chunk
            for (int64_t p = 0; p < 32; ++p) sum += a.q[size_t(l * K + 256 * c + t * P + (g & 1) * 32 + p)];
          EXPECT_EQ(sum, a.sum[size_t(l * G + g)]) << "l " << l << " g " << g;
        }
    }
}

TEST_P(Variant, TernaryRowsQ8) {
  double worst[4] = {0, 0, 0, 0};
  for (int levels : {1, 2, 3})
    for (auto [N, K] : {std::pair<int64_t, int64_t>{37, 384}, {37, 128}, {9, 1152}, {6, 5120}, {5, 17408}}) {
      const auto W = random_ternary(N, K, 60 + uint32_t(K), /*p3=*/0.002);
      for (int64_t M : {1, 5, 64, 67}) {
        SCOPED_TRACE(testing::Message() << "levels " << levels << " N " << N << " K " << K << " M " << M);
        const int64_t G = K / 128, L = levels;
        const auto x = randn(size_t(M * K), 61 + uint32_t(M));
        const auto xq = quantize_rows(*k_, x.data(), M, K, levels);
        // The reference on the dequantised activation: what the integer kernel computes exactly.
        std::vector<float> xd(size_t(M * K));
        for (int64_t m = 0; m < M; ++m) {
          const auto row = dequantize_q8(xq.q.data() + m * L * K, xq.scale.data() + m * G, K, levels);
          std::copy(row.begin(), row.end(), xd.begin() + m * K);
        }
        std::vector<float> want_q(size_t(M * N)), want(size_t(M * N));
        ref::ternary_matmul(W.blocks.data(), N, K, xd.data(), M, want_q.data());
        ref::ternary_matmul(W.blocks.data(), N, K, x.data(), M, want.data());
        const int64_t n0 = 3;
        auto got = poisoned(size_t(M * N));
        for (int64_t n = 0; n < n0; ++n)
          for (int64_t m = 0; m < M; ++m) got[size_t(m * N + n)] = want_q[size_t(m * N + n)];
        if (M == 1)
          k_->ternary_rows_q8_x1(W.blocks.data(), K, n0, N, xq.q.data(), xq.scale.data(),
                                 xq.sum.data(), levels, got.data() + n0);
        else
          k_->ternary_rows_q8_xm(W.blocks.data(), K, n0, N, xq.q.data(), xq.scale.data(),
                                 xq.sum.data(), levels, M, got.data() + n0, N);
        EXPECT_LE(max_rel_err(got.data(), want_q.data(), got.size()), 1e-5);
        const auto bound = q8_bound(W, xq.scale, M, levels);
        double ymax = 0;
        for (float v : want) ymax = std::max(ymax, std::fabs(double(v)));
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_LE(std::fabs(double(got[i]) - want[i]), bound[i] + 1e-5 * ymax) << "output " << i;
        const double e = max_rel_err(got.data(), want.data(), got.size());
        EXPECT_LE(e, kDigitBound[levels]);
        worst[levels] = std::max(worst[levels], e);
      }
    }
  for (int levels : {1, 2, 3})
    std::printf("    %s %d digit(s) vs fp32 truth, Gaussian activations: max rel err %.3g (bound %.2g)\n", GetParam(),
                levels, worst[levels], kDigitBound[levels]);
}

// The same through the op entry points with this variant forced, both activation modes, 1-3 threads:
// results must not depend on the thread count (bit for bit).
TEST_P(Variant, OpsForcedPath) {
  ASSERT_TRUE(cpu::set_kernels(GetParam()));
  EXPECT_STREQ(cpu::kernels_name(), GetParam());
  const int64_t N = 37, K = 384;
  const auto W = random_ternary(N, K, 70, 0.002);
  for (auto act : {cpu::TernaryActivation::f32, cpu::TernaryActivation::q8, cpu::TernaryActivation::q16,
                   cpu::TernaryActivation::q24}) {
    cpu::set_ternary_activation(act);
    for (int64_t M : {1, 5, 64, 67}) {
      const auto x = randn(size_t(M * K), 71 + uint32_t(M));
      std::vector<float> want(size_t(M * N));
      ref::ternary_matmul(W.blocks.data(), N, K, x.data(), M, want.data());
      std::vector<float> first;
      for (int threads : {1, 2, 3}) {
        cpu::set_num_threads(threads);
        auto got = poisoned(size_t(M * N));
        cpu::ternary_matmul(W.blocks.data(), N, K, x.data(), M, got.data());
        SCOPED_TRACE(testing::Message() << "act " << int(act) << " M " << M << " threads " << threads);
        EXPECT_LE(max_rel_err(got.data(), want.data(), got.size()), kDigitBound[int(act)]);
        if (first.empty())
          first = got;
        else
          EXPECT_EQ(0, std::memcmp(first.data(), got.data(), 4 * got.size()));
      }
      // multi: two weight sets sharing one quantised site.
      const auto W2 = random_ternary(11, K, 72, 0.0);
      std::vector<float> want2(size_t(M * 11));
      ref::ternary_matmul(W2.blocks.data(), 11, K, x.data(), M, want2.data());
      auto y1 = poisoned(size_t(M * N)), y2 = poisoned(size_t(M * 11));
      const TernaryOut outs[2] = {{W.blocks.data(), N, y1.data()},
                                  {W2.blocks.data(), 11, y2.data()}};
      cpu::ternary_matmul_multi(outs, 2, K, x.data(), M);
      EXPECT_EQ(0, std::memcmp(first.data(), y1.data(), 4 * y1.size()));
      EXPECT_LE(max_rel_err(y2.data(), want2.data(), y2.size()), kDigitBound[int(act)]);
    }
  }
  cpu::set_num_threads(0);
  // Hadamard and a dot-based op through the forced table.
  const int64_t rows = 3, Kh = 2048;
  auto x = randn(size_t(rows * Kh), 73);
  const auto s = random_signs(size_t(Kh), 74);
  auto a = x, b = x;
  ref::hadamard_forward(a.data(), rows, Kh, s.data(), 1024);
  cpu::hadamard_forward(b.data(), rows, Kh, s.data(), 1024);
  EXPECT_LE(max_rel_err(b.data(), a.data(), a.size()), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Cpu, Variant, ::testing::Values("avx512vnni", "avx512bw", "avx2", "portable"),
                         [](const testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

TEST(CpuKernelsDispatch, NamesAndSwitching) {
  EXPECT_NE(cpu::kernels_name(), nullptr);
  EXPECT_NE(cpu::find_kernels("portable"), nullptr);
  EXPECT_EQ(cpu::find_kernels("sse9"), nullptr);
  EXPECT_FALSE(cpu::set_kernels("sse9"));
  const std::string before = cpu::kernels_name();
  ASSERT_TRUE(cpu::set_kernels("portable"));
  EXPECT_STREQ(cpu::kernels_name(), "portable");
  // "avx512" is the family: the VNNI variant when the CPU has it.
  if (cpu::find_kernels("avx512vnni")) {
    ASSERT_TRUE(cpu::set_kernels("avx512"));
    EXPECT_STREQ(cpu::kernels_name(), "avx512vnni");
  } else if (cpu::find_kernels("avx512bw")) {
    ASSERT_TRUE(cpu::set_kernels("avx512"));
    EXPECT_STREQ(cpu::kernels_name(), "avx512bw");
  } else {
    EXPECT_FALSE(cpu::set_kernels("avx512"));
  }
  ASSERT_TRUE(cpu::set_kernels(before.c_str()));
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") && !std::getenv("BONSAI_CPU_KERNELS")) {
    EXPECT_STREQ(before.c_str(), "avx512vnni");  // the default picks the best
  }
#endif
}

// The digit modes' cost at the 27B widths, through the active variant: max |err| / max |ref| and the RMS
// error relative to the RMS output, for Gaussian activations, and for activations with LLM-like outlier
// channels (40x) raw and after the site's Hadamard rotation (block 1024), which spreads the outliers over
// the block so that per-group scaling keeps its accuracy. The fp32 kernel is printed for scale.
TEST(CpuKernelsAccuracy, DigitsAtModelWidths) {
  const cpu::Kernels& k = cpu::kernels();
  for (int64_t K : {5120, 6144, 17408}) {
    const int64_t N = 256, M = 2, G = K / 128;
    const auto W = random_ternary(N, K, 80 + uint32_t(K), 0.0);
    const auto s = random_signs(size_t(K), 82);
    for (int kind = 0; kind < 3; ++kind) {  // Gaussian, raw outliers, rotated outliers
      auto x = randn(size_t(M * K), 81);
      if (kind > 0)
        for (int64_t m = 0; m < M; ++m)
          for (int64_t c : {int64_t(7), K / 3, K - 100}) x[size_t(m * K + c)] *= 40.0f;
      if (kind == 2) ref::hadamard_forward(x.data(), M, K, s.data(), 1024);
      std::vector<float> want(size_t(M * N));
      ref::ternary_matmul(W.blocks.data(), N, K, x.data(), M, want.data());
      for (int levels : {0, 1, 2, 3}) {
        auto got = poisoned(size_t(M * N));
        if (levels == 0) {
          for (int64_t m = 0; m < M; ++m)
            k.ternary_rows_x1(W.blocks.data(), K, 0, N, x.data() + m * K, got.data() + m * N);
        } else {
          const auto xq = quantize_rows(k, x.data(), M, K, levels);
          for (int64_t m = 0; m < M; ++m)
            k.ternary_rows_q8_x1(W.blocks.data(), K, 0, N, xq.q.data() + m * levels * K,
                                 xq.scale.data() + m * G, xq.sum.data() + m * levels * G, levels, got.data() + m * N);
        }
        double se = 0, sy = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          se += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
          sy += double(want[i]) * want[i];
        }
        const double e = max_rel_err(got.data(), want.data(), got.size()), rms = std::sqrt(se / sy);
        const char* what[] = {"Gaussian", "40x outliers, raw", "40x outliers, Hadamard-rotated"};
        const char* mode[] = {"f32", "q8", "q16", "q24"};
        std::printf("    %s %-3s K=%-5lld %-31s max rel err %.3g, rms rel err %.3g\n", k.name, mode[levels],
                    (long long)K, what[kind], e, rms);
        const double scale = kind == 1 ? 4.0 : 1.0;  // un-rotated outliers: a 40x group scale
        if (levels == 1) {
          EXPECT_LE(e, scale * kQ8Bound);
          EXPECT_LE(rms, scale * 8e-3);
        } else if (levels == 2) {
          EXPECT_LE(e, scale * 1e-4);
        } else {
          EXPECT_LE(e, 1e-5);  // q24 and f32: the fp32 floor
        }
      }
    }
  }
}

}  // namespace
