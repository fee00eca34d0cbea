// The fused CPU sites (backend/cpu/site.h) against the reference ops they replace, on every kernel
// variant (forced one at a time; a variant the CPU cannot run is skipped), at odd shapes: rows 1, 3, 7;
// widths with one block, several blocks and the 27B widths (5120 and 17408 with block 1024). Outputs are
// poisoned first. Tolerance: max |got - ref| / max |ref| <= 1e-6 (the unfused CPU ops' own bound).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/site.h"
#include "backend/cpu/thread_pool.h"
#include "backend/ref/ops.h"
#include "forced_kernels.h"
#include "op_test_util.h"
#include "util/error.h"

using namespace bonsai;
using namespace bonsai::test;

namespace {

struct Shape {
  int64_t rows, n, block;
};
const Shape kShapes[] = {{1, 128, 128}, {3, 384, 128}, {7, 2048, 256}, {1, 5120, 1024}, {3, 5120, 1024},
                         {1, 17408, 1024}, {2, 17408, 1024}};

class Site : public ForcedKernels {};

TEST_P(Site, AddRmsnormRotate) {
  for (const Shape& s : kShapes)
    for (bool add : {true, false})
      for (bool with_gain : {true, false})
        for (int threads : {1, 2}) {
          SCOPED_TRACE(testing::Message() << "rows " << s.rows << " n " << s.n << " block " << s.block << " add "
                                          << add << " gain " << with_gain << " threads " << threads);
          cpu::set_num_threads(threads);
          const size_t sz = size_t(s.rows * s.n);
          const auto h0 = randn(sz, 7 + uint32_t(s.n), 2.0f), delta = randn(sz, 8 + uint32_t(s.n));
          const auto gain = uniform(size_t(s.n), 9, 0.5f, 1.5f);
          const auto signs = random_signs(size_t(s.n), 10);
          const float* g = with_gain ? gain.data() : nullptr;
          const float* d = add ? delta.data() : nullptr;
          // Reference: (add_)rmsnorm, then hadamard_forward of a copy.
          auto hr = h0;
          std::vector<float> outr(sz), siter;
          if (add) ref::add_rmsnorm(hr.data(), d, s.rows, s.n, g, 1e-6f, outr.data());
          else ref::rmsnorm(hr.data(), s.rows, s.n, g, 1e-6f, outr.data());
          siter = outr;
          ref::hadamard_forward(siter.data(), s.rows, s.n, signs.data(), s.block);
          auto hc = h0;
          auto outc = poisoned(sz), sitec = poisoned(sz);
          cpu::add_rmsnorm_rotate(hc.data(), d, s.rows, s.n, g, 1e-6f, outc.data(), sitec.data(), signs.data(),
                                  s.block);
          EXPECT_CLOSE(hc, hr, 1e-6);
          EXPECT_CLOSE(outc, outr, 1e-6);
          EXPECT_CLOSE(sitec, siter, 1e-6);
        }
}

TEST_P(Site, SiluMulRotate) {
  for (const Shape& s : kShapes)
    for (bool alias : {false, true})
      for (int threads : {1, 2}) {
        SCOPED_TRACE(testing::Message() << "rows " << s.rows << " n " << s.n << " block " << s.block << " alias "
                                        << alias << " threads " << threads);
        cpu::set_num_threads(threads);
        const size_t sz = size_t(s.rows * s.n);
        const auto gate = randn(sz, 11 + uint32_t(s.n), 3.0f), up = randn(sz, 12 + uint32_t(s.n));
        const auto signs = random_signs(size_t(s.n), 13);
        std::vector<float> want(sz);
        ref::silu_mul(gate.data(), up.data(), int64_t(sz), want.data());
        ref::hadamard_forward(want.data(), s.rows, s.n, signs.data(), s.block);
        auto g = gate;
        auto site = poisoned(sz);
        float* out = alias ? g.data() : site.data();  // the forward writes the site over the gate buffer
        cpu::silu_mul_rotate(g.data(), up.data(), s.rows, s.n, out, signs.data(), s.block);
        const std::vector<float> got(out, out + sz);
        EXPECT_CLOSE(got, want, 1e-6);
      }
}

TEST(SiteShapes, RejectsBadBlocks) {
  std::vector<float> x(384), y(384), z(384);
  EXPECT_THROW(cpu::add_rmsnorm_rotate(x.data(), nullptr, 1, 384, nullptr, 1e-6f, y.data(), z.data(), nullptr, 256),
               Error);
  EXPECT_THROW(cpu::silu_mul_rotate(x.data(), y.data(), 1, 384, z.data(), nullptr, 96), Error);
}

INSTANTIATE_TEST_SUITE_P(AllVariants, Site, ::testing::Values("avx512vnni", "avx512bw", "avx2", "portable"),
                         [](const testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

}  // namespace
