// The prefill site on one warp per 1024 chunk (site_warp_kernel, Options::site_warp, rows >= 64) against
// the block-per-chunk site_kernel: the same producer op -> copy / permute -> sign + FWHT -> the linear that
// reads it (a GEMM at 70 rows) on two backends that differ only in site_warp. The fp32 site, the producer's
// own output and the linear's outputs are EQUAL (the same operations in the same order) for every pre-op
// but the gated norm (its sum of squares in another order: <= 1e-5 relative on the site, 1e-3 on the
// outputs), at FWHT blocks of 1024, 128 and 16, q8 and q16; the inverse transform too.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "cuda_test_util.h"

using namespace bonsai;
using namespace bonsai::cudatest;

TEST(CudaSite, WarpSiteEqualsTheBlockSiteKernel) {
  BONSAI_REQUIRE_GPU();
  const int64_t rows = 70, K = 3072, Dv = 128;
  TernaryMatrix& w = random_matrix(300, K, 91, 0.02);
  const auto a = randn(size_t(rows * K), 92), b = randn(size_t(rows * K), 93), gain = uniform(size_t(Dv), 94, 0.5f, 1.5f);
  const auto s = random_signs(size_t(K), 95);
  std::vector<int32_t> perm(static_cast<size_t>(K));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(96));
  for (const int levels : {1, 2}) {
    CudaBackend::Options on, off;
    on.site_warp = true;
    off.site_warp = false;
    on.act_levels = off.act_levels = levels;
    CudaBackend warp(on), block(off);
    for (int64_t n : {int64_t(1024), int64_t(128), int64_t(16)})
      for (int kind = 0; kind < 5; ++kind) {  // silu*up, x*sigmoid(g), gated norm, plain rotate, gather + rotate
        std::vector<float> site[2], prod[2], y[2], inv[2];
        for (CudaBackend* be : {&warp, &block}) {
          be->prepare_matrix(w);
          Buffer sd = up_bytes(*be, s), pd = up_bytes(*be, perm), gd = up(*be, gain);
          const auto* sp = reinterpret_cast<const int8_t*>(sd.data());
          Buffer da = up(*be, a), db = up(*be, b), st = poisoned(*be, size_t(rows * K)), yd = poisoned(*be, size_t(rows * w.rows));
          if (kind == 0) be->silu_mul(da.data(), db.data(), rows * K, da.data());
          if (kind == 1) be->sigmoid_gate_mul(da.data(), db.data(), rows * K);
          if (kind == 2) be->gated_rmsnorm(da.data(), db.data(), gd.data(), rows * K / Dv, Dv, 1e-6f, da.data());
          if (kind == 4) be->permute_cols(da.data(), rows, K, reinterpret_cast<const int32_t*>(pd.data()), st.data());
          else be->copy_rows(st.data(), K, da.data(), K, rows, K);
          be->hadamard_forward(st.data(), rows, K, sp, n);
          const LinearOut out{&w, yd.data()};
          be->linear(&out, 1, K, st.data(), rows);
          const size_t i = be == &block;
          site[i] = down(*be, st);
          prod[i] = down(*be, da);
          y[i] = down(*be, yd);
          be->hadamard_inverse(st.data(), rows, K, sp, n);
          inv[i] = down(*be, st);
        }
        const std::string what = "levels " + std::to_string(levels) + " n " + std::to_string(n) + " kind " + std::to_string(kind);
        if (kind == 2) {
          EXPECT_LE(rel_err(site[0], site[1]), 1e-5) << what;
          EXPECT_LE(rel_err(y[0], y[1]), 1e-3) << what;
          EXPECT_LE(rel_err(inv[0], inv[1]), 1e-5) << what;
        } else {
          EXPECT_EQ(site[0], site[1]) << what;
          EXPECT_EQ(y[0], y[1]) << what;
          EXPECT_EQ(inv[0], inv[1]) << what;
        }
        EXPECT_LE(rel_err(prod[0], prod[1]), kind == 2 ? 1e-5 : 0.0) << what << " (producer output)";
      }
  }
  // The switch decides, and small row counts keep the block kernel.
  cuda::SiteDesc d;
  d.rows = 64;
  d.K = 5120;
  d.ld = 5120;
  d.n = 1024;
  EXPECT_TRUE(cuda::site_warp_supported(d));
  d.rows = 32;
  EXPECT_FALSE(cuda::site_warp_supported(d));
  d.rows = 256;
  d.warp = false;
  EXPECT_FALSE(cuda::site_warp_supported(d));
  d.warp = true;
  d.pre = cuda::kPreAddNorm;
  EXPECT_FALSE(cuda::site_warp_supported(d));
}
