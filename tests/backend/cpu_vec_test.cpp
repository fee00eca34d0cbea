// The CPU ops built on backend/cpu/vec.h (SiLU / sigmoid with the vector exp, the GDN delta-rule step,
// softmax attention including the position-split decode) against the reference, on every kernel variant
// (forced one at a time: the vec width follows it; a variant the CPU cannot run is skipped), at odd sizes
// (tails of every vector width), outputs poisoned first. Tolerances: elementwise and norms 1e-6,
// attention and the delta rule 1e-5 (max |got - ref| / max |ref|, as tests/backend/cpu_vs_ref_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/thread_pool.h"
#include "backend/ref/ops.h"
#include "forced_kernels.h"
#include "op_test_util.h"

using namespace bonsai;
using namespace bonsai::test;

namespace {

class Vec : public ForcedKernels {};

TEST_P(Vec, Elementwise) {
  for (int64_t n : {1, 3, 15, 17, 33, 100, 17408, 16385}) {
    SCOPED_TRACE(testing::Message() << "n " << n);
    // Wide range: the exp clamps (|x| > 87) and tiny arguments both occur.
    const auto g = randn(size_t(n), 40 + uint32_t(n), 30.0f), u = randn(size_t(n), 41 + uint32_t(n));
    std::vector<float> a = std::vector<float>(size_t(n)), b = poisoned(size_t(n));
    ref::silu_mul(g.data(), u.data(), n, a.data());
    cpu::silu_mul(g.data(), u.data(), n, b.data());
    EXPECT_CLOSE(b, a, 1e-6);
    auto x1 = u, x2 = u;
    ref::sigmoid_gate_mul(x1.data(), g.data(), n);
    cpu::sigmoid_gate_mul(x2.data(), g.data(), n);
    EXPECT_CLOSE(x2, x1, 1e-6);
  }
}

TEST_P(Vec, GatedRmsnormAndConv) {
  for (auto [rows, Dv] : {std::tuple<int64_t, int64_t>{3, 128}, {5, 37}, {2, 700}}) {
    const auto o = randn(size_t(rows * Dv), 50), z = randn(size_t(rows * Dv), 51, 4.0f);
    const auto g = uniform(size_t(Dv), 52, 0.5f, 1.5f);
    std::vector<float> a = std::vector<float>(size_t(rows * Dv)), b = poisoned(size_t(rows * Dv));
    ref::gated_rmsnorm(o.data(), z.data(), g.data(), rows, Dv, 1e-6f, a.data());
    cpu::gated_rmsnorm(o.data(), z.data(), g.data(), rows, Dv, 1e-6f, b.data());
    EXPECT_CLOSE(b, a, 1e-6);
  }
  for (auto [T, C] : {std::tuple<int64_t, int64_t>{1, 10240}, {3, 37}, {6, 129}}) {
    const int64_t Kc = 4;
    const auto x = randn(size_t(T * C), 53), taps = randn(size_t(C * Kc), 54, 0.5f);
    auto s1 = randn(size_t((Kc - 1) * C), 55), s2 = s1;
    std::vector<float> a = std::vector<float>(size_t(T * C)), b = poisoned(size_t(T * C));
    ref::gdn_conv(x.data(), s1.data(), taps.data(), T, C, Kc, a.data());
    cpu::gdn_conv(x.data(), s2.data(), taps.data(), T, C, Kc, b.data());
    EXPECT_CLOSE(b, a, 1e-6);
    EXPECT_CLOSE(s2, s1, 1e-6);
  }
}

TEST_P(Vec, DeltaRuleStep) {
  // Dv: a whole 128 row (the 8-vector block), 48 (a 16 / 8 / 4 multiple, no full block), 37 (a scalar tail).
  for (auto [T, Nk, Nv, Dk, Dv] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{3, 2, 6, 128, 128},
                                   {5, 1, 3, 24, 48}, {4, 2, 2, 19, 37}})
    for (int threads : {1, 2}) {
      SCOPED_TRACE(testing::Message() << "T " << T << " Dk " << Dk << " Dv " << Dv << " threads " << threads);
      cpu::set_num_threads(threads);
      GdnCase c = make_gdn_case(T, Nk, Nv, Dk, Dv, 60);
      auto sr = c.state, sc = c.state;
      std::vector<float> a = std::vector<float>(size_t(T * Nv * Dv)), b = poisoned(size_t(T * Nv * Dv));
      ref::gdn_recurrent(sr.data(), c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), T, Nk, Nv, Dk, Dv,
                         a.data());
      cpu::gdn_recurrent(sc.data(), c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), T, Nk, Nv, Dk, Dv,
                         b.data());
      EXPECT_CLOSE(b, a, 1e-5);
      EXPECT_CLOSE(sc, sr, 1e-5);
    }
}

TEST_P(Vec, AttentionDecodeSplitByPositions) {
  // T >= 512 takes the position-split path: whole spans, a ragged last span, GQA 6:1 and 2:1, odd D.
  for (auto [T, Hq, Hkv, D] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{512, 24, 4, 256}, {777, 24, 4, 256},
                               {1300, 6, 3, 40}, {511, 4, 2, 33}})
    for (int threads : {1, 2}) {
      SCOPED_TRACE(testing::Message() << "T " << T << " Hq " << Hq << " Hkv " << Hkv << " D " << D << " threads "
                                      << threads);
      cpu::set_num_threads(threads);
      const float scale = 1.0f / std::sqrt(float(D));
      const auto q = randn(size_t(Hq * D), 70, 2.0f), k = randn(size_t(T * Hkv * D), 71),
                 v = randn(size_t(T * Hkv * D), 72);
      std::vector<float> a = std::vector<float>(size_t(Hq * D)), b = poisoned(size_t(Hq * D));
      ref::attention_decode(q.data(), k.data(), v.data(), T, Hq, Hkv, D, scale, a.data());
      cpu::attention_decode(q.data(), k.data(), v.data(), T, Hq, Hkv, D, scale, b.data());
      EXPECT_CLOSE(b, a, 1e-5);
    }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, Vec, ::testing::Values("avx512vnni", "avx512bw", "avx2", "portable"),
                         [](const testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

}  // namespace
