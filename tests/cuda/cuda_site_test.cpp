// The prefill site on one warp per 1024 chunk (site_warp_kernel, Options::site_warp, rows >= 64) against
// the block-per-chunk site_kernel: the same producer op -> copy / permute -> sign + FWHT -> the linear that
// reads it (a GEMM at 70 rows) on two backends that differ only in site_warp. The fp32 site, the producer's
// own output and the linear's outputs are EQUAL (the same operations in the same order) for every pre-op
// but the gated norm (its sum of squares in another order: <= 1e-5 relative on the site, 1e-3 on the
// outputs), at FWHT blocks of 1024, 128 and 16, q8 and q16; the inverse transform too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "cuda_test_util.h"

using namespace bonsai;
using namespace bonsai::cudatest;

namespace {

// What one site run gives: the fp32 site, the producer's own output, the linear's output, the inverse transform.
struct SiteRun {
  std::vector<float> site, prod, y, inv;
};

// On `be`: the producer op `kind` (0 silu*up, 1 x*sigmoid(g), 2 gated norm over Dv, 3 none, 4 gather) of a, b
// [rows, K], then copy / permute -> sign + FWHT (block n) -> the linear over w that reads it, then the inverse.
SiteRun run_site(CudaBackend& be, int kind, TernaryMatrix& w, const std::vector<int8_t>& s,
                 const std::vector<int32_t>& perm, const std::vector<float>& gain, const std::vector<float>& a,
                 const std::vector<float>& b, int64_t rows, int64_t K, int64_t Dv, int64_t n) {
  be.prepare_matrix(w);
  Buffer sd = up_bytes(be, s), pd = up_bytes(be, perm), gd = up(be, gain);
  const auto* sp = reinterpret_cast<const int8_t*>(sd.data());
  Buffer da = up(be, a), db = up(be, b), st = poisoned(be, size_t(rows * K)), yd = poisoned(be, size_t(rows * w.rows));
  if (kind == 0) be.silu_mul(da.data(), db.data(), rows * K, da.data());
  if (kind == 1) be.sigmoid_gate_mul(da.data(), db.data(), rows * K);
  if (kind == 2) be.gated_rmsnorm(da.data(), db.data(), gd.data(), rows * K / Dv, Dv, 1e-6f, da.data());
  if (kind == 4) be.permute_cols(da.data(), rows, K, reinterpret_cast<const int32_t*>(pd.data()), st.data());
  else be.copy_rows(st.data(), K, da.data(), K, rows, K);
  be.hadamard_forward(st.data(), rows, K, sp, n);
  const LinearOut out{&w, yd.data()};
  be.linear(&out, 1, K, st.data(), rows);
  SiteRun r;
  r.site = down(be, st);
  r.prod = down(be, da);
  r.y = down(be, yd);
  be.hadamard_inverse(st.data(), rows, K, sp, n);
  r.inv = down(be, st);
  return r;
}

// One norm site of `rows` x K on a backend that folds the norm into the site (fused) and on one that launches it
// apart (plain): the forward's norm_site + hadamard_site (Backend::add_rmsnorm_rotate's default body) then the linear
// that reads it. The residual, the normed x, the fp32 site and the linear's outputs must be EQUAL, the linear right
// against the exact int8 arithmetic, and the fused path one launch shorter.
void expect_norm_folded(CudaBackend& fused, CudaBackend& plain, TernaryMatrix& w, const std::vector<int8_t>& s,
                        const std::vector<float>& gain, const std::vector<float>& h0, const std::vector<float>& d0,
                        int64_t rows, int64_t K, int64_t n, bool add, int levels) {
  std::vector<float> h[2], x[2], site[2], y[2];
  uint64_t kernels[2];
  for (CudaBackend* be : {&fused, &plain}) {
    const size_t i = be == &plain;
    be->prepare_matrix(w);
    Buffer sd = up_bytes(*be, s), gd = up(*be, gain), hd = up(*be, h0), dd = up(*be, d0);
    Buffer xd = poisoned(*be, size_t(rows * K)), st = poisoned(*be, size_t(rows * K)), yd = poisoned(*be, size_t(rows * w.rows));
    const auto* sp = reinterpret_cast<const int8_t*>(sd.data());
    const uint64_t k0 = be->stats().kernels;
    if (add) be->add_rmsnorm(hd.data(), dd.data(), rows, K, gd.data(), 1e-6f, xd.data());
    else be->rmsnorm(hd.data(), rows, K, gd.data(), 1e-6f, xd.data());
    be->copy_rows(st.data(), K, xd.data(), K, rows, K);
    be->hadamard_forward(st.data(), rows, K, sp, n);
    const LinearOut out{&w, yd.data()};
    be->linear(&out, 1, K, st.data(), rows);
    kernels[i] = be->stats().kernels - k0;
    h[i] = down(*be, hd);
    x[i] = down(*be, xd);
    site[i] = down(*be, st);
    y[i] = down(*be, yd);
  }
  const std::string what = "levels " + std::to_string(levels) + " K " + std::to_string(K) + " rows " +
                           std::to_string(rows) + " n " + std::to_string(n) + (add ? " add" : " plain");
  EXPECT_EQ(h[0], h[1]) << what << " (residual)";
  EXPECT_EQ(x[0], x[1]) << what << " (normed x)";
  EXPECT_EQ(site[0], site[1]) << what << " (site)";
  EXPECT_EQ(y[0], y[1]) << what << " (linear)";
  EXPECT_LE(rel_err(y[1], quantised_reference(w, site[1], rows, levels)), 1e-4) << what;
  EXPECT_EQ(kernels[0] + 1, kernels[1]) << what << " (the norm launch folded)";
}

}  // namespace

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
    on.row_units = false;  // the per-group units of site_kernel (the row-unit form: warp_ru below)
    on.act_levels = off.act_levels = levels;
    CudaBackend warp(on), block(off);
    CudaBackend::Options ru = on;
    ru.row_units = true;
    CudaBackend warp_ru(ru);
    for (int64_t n : {int64_t(1024), int64_t(128), int64_t(16)})
      for (int kind = 0; kind < 5; ++kind) {  // silu*up, x*sigmoid(g), gated norm, plain rotate, gather + rotate
        const SiteRun r[2] = {run_site(warp, kind, w, s, perm, gain, a, b, rows, K, Dv, n),
                              run_site(block, kind, w, s, perm, gain, a, b, rows, K, Dv, n)};
        const std::string what = "levels " + std::to_string(levels) + " n " + std::to_string(n) + " kind " + std::to_string(kind);
        // Round 11: the warp site's loads / stores through shared memory (the default) or direct
        // (BONSAI_CUDA_SITE_STAGE=0): only the memory access differs, every output EQUAL.
        setenv("BONSAI_CUDA_SITE_STAGE", "0", 1);
        const SiteRun direct = run_site(warp, kind, w, s, perm, gain, a, b, rows, K, Dv, n);
        unsetenv("BONSAI_CUDA_SITE_STAGE");
        EXPECT_EQ(direct.site, r[0].site) << what << " (staged vs direct)";
        EXPECT_EQ(direct.y, r[0].y) << what << " (staged vs direct)";
        EXPECT_EQ(direct.inv, r[0].inv) << what << " (staged vs direct)";
        EXPECT_EQ(direct.prod, r[0].prod) << what << " (staged vs direct)";
        if (kind == 2) {
          EXPECT_LE(rel_err(r[0].site, r[1].site), 1e-5) << what;
          EXPECT_LE(rel_err(r[0].y, r[1].y), 1e-3) << what;
          EXPECT_LE(rel_err(r[0].inv, r[1].inv), 1e-5) << what;
        } else {
          EXPECT_EQ(r[0].site, r[1].site) << what;
          EXPECT_EQ(r[0].y, r[1].y) << what;
          EXPECT_EQ(r[0].inv, r[1].inv) << what;
        }
        EXPECT_LE(rel_err(r[0].prod, r[1].prod), kind == 2 ? 1e-5 : 0.0) << what << " (producer output)";
        // Round 19: the row-unit form (one block per row, Options::row_units) runs the same transform (site and
        // inverse outputs EQUAL to the per-group warp site), staged or direct alike; only the digits' unit differs,
        // so the product moves within the quantisation (and must move: the row unit is really used).
        const SiteRun u = run_site(warp_ru, kind, w, s, perm, gain, a, b, rows, K, Dv, n);
        setenv("BONSAI_CUDA_SITE_STAGE", "0", 1);
        const SiteRun ud = run_site(warp_ru, kind, w, s, perm, gain, a, b, rows, K, Dv, n);
        unsetenv("BONSAI_CUDA_SITE_STAGE");
        EXPECT_TRUE(warp_ru.row_quantised(rows, K)) << what;
        EXPECT_EQ(u.site, r[0].site) << what << " (row units)";
        EXPECT_EQ(u.inv, r[0].inv) << what << " (row units)";
        EXPECT_EQ(u.prod, r[0].prod) << what << " (row units)";
        EXPECT_EQ(ud.y, u.y) << what << " (row units, staged vs direct)";
        EXPECT_NE(u.y, r[0].y) << what << " (row units: the product must differ from the per-group one)";
        EXPECT_LE(rel_err(u.y, r[0].y), levels == 2 ? 1e-3 : 5e-2) << what << " (row units)";
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

// Round 19 (host only): where the site quantises with one unit per row. Only when asked, on the warp site's rows (>= 64)
// and shapes, an int8 output, no AddNorm (its own kernels), at most 20 chunks of 1024 (one block of <= 640 threads).
// A prefill quantise site of 64 rows x 5,120 (n 1024) on 16-byte aligned stand-ins: the host rule tests' start.
static cuda::SiteDesc prefill_site_desc() {
  alignas(16) static int8_t buf[16];
  cuda::SiteDesc d;
  d.src = reinterpret_cast<const float*>(buf);
  d.xq = buf;
  d.rows = 64;
  d.K = d.ld = 5120;
  d.n = 1024;
  return d;
}

TEST(CudaSite, RowUnitsRule) {
  cuda::SiteDesc d = prefill_site_desc();
  int8_t* const buf = d.xq;
  EXPECT_FALSE(cuda::site_row_units(d));  // not asked
  d.row_units = true;
  EXPECT_TRUE(cuda::site_row_units(d));
  d.K = d.ld = 17408;  // ffn_down's input: 17 chunks
  EXPECT_TRUE(cuda::site_row_units(d));
  d.K = d.ld = 21504;  // 21 chunks: more warps than the row-unit block holds
  EXPECT_FALSE(cuda::site_row_units(d));
  d.K = d.ld = 5120;
  d.rows = 32;  // batched decode: site_kernel
  EXPECT_FALSE(cuda::site_row_units(d));
  d.rows = 300;
  d.xq = nullptr;  // no int8 output: nothing to quantise
  EXPECT_FALSE(cuda::site_row_units(d));
  d.xq = buf;
  d.pre = cuda::kPreAddNorm;
  EXPECT_FALSE(cuda::site_row_units(d));
  d.pre = cuda::kPreNone;
  d.K = d.ld = 5120 + 128;  // not whole 1024 chunks
  EXPECT_FALSE(cuda::site_row_units(d));
}

// Round 28 (Options::site_rows_pipe): the row-unit site on site_warp_rows_kernel (a block walks several rows, the next
// row's chunk copied into shared memory under this row's transform) gives site_warp_kernel<true, true>'s outputs bit
// for bit: every producer kind (the gather keeps the one-row kernel), FWHT blocks 1024 and 16, q16 and q8; 2,000 rows
// at K 3,072 (more rows than resident blocks: each block walks 2-3) and 300 at 17,408 (ffn_down's input, a second
// source: one block per SM).
TEST(CudaSite, RowsPipeEqualsTheRowUnitSite) {
  BONSAI_REQUIRE_GPU();
  const int64_t Dv = 128;
  for (const auto& [rows, K] : {std::pair<int64_t, int64_t>{2000, 3072}, {300, 17408}}) {
    TernaryMatrix& w = random_matrix(96, K, uint32_t(300 + K / 1024), 0.02);
    const auto a = randn(size_t(rows * K), 301), b = randn(size_t(rows * K), 302);
    const auto gain = uniform(size_t(Dv), 303, 0.5f, 1.5f);
    const auto s = random_signs(size_t(K), 304);
    std::vector<int32_t> perm(static_cast<size_t>(K));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(305));
    for (const int levels : {2, 1}) {
      CudaBackend::Options one;
      one.site_warp = one.row_units = true;
      one.site_rows_pipe = false;
      one.act_levels = levels;
      CudaBackend::Options piped = one;
      piped.site_rows_pipe = true;
      CudaBackend b1(one), b2(piped);
      for (const int64_t n : {int64_t(1024), int64_t(16)})
        for (int kind = 0; kind < 5; ++kind) {
          const SiteRun r1 = run_site(b1, kind, w, s, perm, gain, a, b, rows, K, Dv, n);
          const SiteRun r2 = run_site(b2, kind, w, s, perm, gain, a, b, rows, K, Dv, n);
          const std::string what = "rows " + std::to_string(rows) + " K " + std::to_string(K) + " levels " +
                                   std::to_string(levels) + " n " + std::to_string(n) + " kind " + std::to_string(kind);
          EXPECT_EQ(r2.site, r1.site) << what;
          EXPECT_EQ(r2.prod, r1.prod) << what;
          EXPECT_EQ(r2.y, r1.y) << what;
          EXPECT_EQ(r2.inv, r1.inv) << what;
          if (kind == 0 && n == 1024 && levels == 2)  // once a shape: the reference is ~1 G multiply-adds on the host
            EXPECT_LE(rel_err(r2.y, quantised_reference(w, r2.site, rows, levels, true)), 1e-5) << what;
        }
    }
  }
}

// Round 28 (host only): where the row-unit site runs on site_warp_rows_kernel: asked, a row-unit site, no gather, its
// load tiles (one per source) and store tiles in one block's shared memory (18 chunks with a second source).
TEST(CudaSite, RowsPipeRule) {
  alignas(16) static int32_t perm[4];
  cuda::SiteDesc d = prefill_site_desc();
  d.row_units = true;
  EXPECT_FALSE(cuda::site_rows_pipe_supported(d));  // not asked
  d.rows_pipe = true;
  EXPECT_TRUE(cuda::site_rows_pipe_supported(d));
  d.K = d.ld = 20480;  // 20 chunks, one source: 20 x 8.1 KB
  EXPECT_TRUE(cuda::site_rows_pipe_supported(d));
  d.pre = cuda::kPreSiluMul;
  d.src2 = d.src;
  EXPECT_FALSE(cuda::site_rows_pipe_supported(d));  // two sources: 20 x 12.1 KB > 227 KB
  d.K = d.ld = 18432;
  EXPECT_TRUE(cuda::site_rows_pipe_supported(d));   // 18 chunks fit
  d.pre = cuda::kPreNone;
  d.src2 = nullptr;
  d.perm = perm;
  EXPECT_FALSE(cuda::site_rows_pipe_supported(d));  // the gather
  d.perm = nullptr;
  d.row_units = false;
  EXPECT_FALSE(cuda::site_rows_pipe_supported(d));  // per-group units: the one-row-per-warp kernel
  EXPECT_TRUE(CudaBackend::Options{}.site_rows_pipe);  // the backend's default since round 28
}

// Round 9: the add_rmsnorm / rmsnorm fused into the site of small row counts as one thread-block cluster per row
// (Options::norm_cluster, site_kernel_cluster) against the unfused norm_kernel + site_kernel: the residual, the
// normed x, the fp32 site and the linear's outputs are EQUAL (the cluster replays norm_kernel's sum order), at
// 1 .. 32 rows (5: not a power of two), K from one tile (1024: a cluster of one block) to 8 tiles, FWHT blocks of
// 1024 and 128, with and without the residual add; the fused path must launch one kernel fewer per norm.
TEST(CudaSite, NormClusterEqualsUnfusedNormAndSite) {
  BONSAI_REQUIRE_GPU();
  for (const int levels : {2, 1})
    for (const int64_t K : {int64_t(5120), int64_t(1024), int64_t(2048), int64_t(8192)}) {
      TernaryMatrix& w = random_matrix(96, K, uint32_t(200 + K / 1024), 0.02);
      const auto s = random_signs(size_t(K), 201);
      const auto gain = uniform(size_t(K), 202, 0.5f, 1.5f);
      CudaBackend::Options on, off;
      on.norm_cluster = K == 8192 ? 1 : 2;  // 2: the residual stored after the exchange
      off.norm_cluster = 0;
      on.site_row_norm = off.site_row_norm = 0;  // site_kernel_cluster (site_row_norm_kernel: RowNormSite*)
      on.site_xpose = K == 1024 ? 1 : K == 2048 ? 0 : 2;  // the cluster with each tail (the unfused path: none)
      off.site_xpose = 0;
      on.act_levels = off.act_levels = levels;
      CudaBackend fused(on), plain(off);
      for (const int64_t rows : {int64_t(1), int64_t(2), int64_t(5), int64_t(8), int64_t(32)})
        for (const int64_t n : {int64_t(1024), int64_t(128)})
          for (const bool add : {true, false}) {
            const auto h0 = randn(size_t(rows * K), uint32_t(203 + rows), 2.f), d0 = randn(size_t(rows * K), uint32_t(204 + rows));
            expect_norm_folded(fused, plain, w, s, gain, h0, d0, rows, K, n, add, levels);
          }
    }
  // Shapes: at most 8 tiles of 1024, FWHT blocks up to 1024.
  EXPECT_TRUE(cuda::site_cluster_shape_ok(5120, 1024));
  EXPECT_TRUE(cuda::site_cluster_shape_ok(8192, 128));
  EXPECT_FALSE(cuda::site_cluster_shape_ok(9216, 1024));
  EXPECT_FALSE(cuda::site_cluster_shape_ok(5120, 2048));
  EXPECT_FALSE(cuda::site_cluster_shape_ok(1536, 128));
}

// Rounds 26-27: the add + rmsnorm site of decode rows on 128-thread blocks (Options::site_row_norm, site_row_norm_kernel:
// one cluster per row, the sum of squares through distributed shared memory) against the unfused norm_kernel + the
// row site: the residual is EQUAL (the same sums), the normed row, the fp32 site within 1e-6 relative (the norm's sum
// of squares in another order), the linear right against the exact int8 arithmetic on the fused path's own site and
// within 1e-3 of the unfused one; one launch fewer. Rows 1 / 5 / 32, K from one tile to 8, FWHT 1024 and 128 (no
// exchange), with and without the residual add, q16 and q8.
TEST(CudaSite, RowNormSiteMatchesTheUnfusedNorm) {
  BONSAI_REQUIRE_GPU();
  for (const int levels : {2, 1})
    for (const int64_t K : {int64_t(5120), int64_t(1024), int64_t(8192)}) {
      TernaryMatrix& w = random_matrix(96, K, uint32_t(600 + K / 1024), 0.02);
      const auto signs = random_signs(size_t(K), 601);
      const auto gain = uniform(size_t(K), 602, 0.5f, 1.5f);
      CudaBackend::Options on, off;
      off.norm_cluster = 0;
      on.site_row_norm = 2;  // every row count (the default)
      on.act_levels = off.act_levels = levels;
      CudaBackend fused(on), plain(off);
      for (const int64_t rows : {int64_t(1), int64_t(5), int64_t(32)})
        for (const int64_t n : {int64_t(1024), int64_t(128)})
          for (const bool add : {true, false}) {
            const auto h0 = randn(size_t(rows * K), uint32_t(603 + rows), 2.f), d0 = randn(size_t(rows * K), uint32_t(604 + rows));
            std::vector<float> h[2], x[2], site[2], y[2];
            uint64_t kernels[2];
            for (CudaBackend* be : {&fused, &plain}) {
              const size_t i = be == &plain;
              be->prepare_matrix(w);
              Buffer sd = up_bytes(*be, signs), gd = up(*be, gain), hd = up(*be, h0), dd = up(*be, d0);
              Buffer xd = poisoned(*be, size_t(rows * K)), st = poisoned(*be, size_t(rows * K)),
                     yd = poisoned(*be, size_t(rows * w.rows));
              const uint64_t k0 = be->stats().kernels;
              if (add) be->add_rmsnorm(hd.data(), dd.data(), rows, K, gd.data(), 1e-6f, xd.data());
              else be->rmsnorm(hd.data(), rows, K, gd.data(), 1e-6f, xd.data());
              be->copy_rows(st.data(), K, xd.data(), K, rows, K);
              be->hadamard_forward(st.data(), rows, K, reinterpret_cast<const int8_t*>(sd.data()), n);
              const LinearOut out{&w, yd.data()};
              be->linear(&out, 1, K, st.data(), rows);
              y[i] = down(*be, yd);
              kernels[i] = be->stats().kernels - k0;
              h[i] = down(*be, hd);
              x[i] = down(*be, xd);
              site[i] = down(*be, st);
            }
            const std::string what = "levels " + std::to_string(levels) + " K " + std::to_string(K) + " rows " +
                                     std::to_string(rows) + " n " + std::to_string(n) + (add ? " add" : " plain");
            EXPECT_EQ(h[0], h[1]) << what << " (residual)";
            EXPECT_LE(rel_err(x[0], x[1]), 1e-6) << what << " (normed x)";
            EXPECT_LE(rel_err(site[0], site[1]), 1e-6) << what << " (site)";
            EXPECT_LE(rel_err(y[0], quantised_reference(w, site[0], rows, levels)), 1e-4) << what;
            EXPECT_LE(rel_err(y[0], y[1]), 1e-3) << what << " (linear)";
            EXPECT_EQ(kernels[0] + 1, kernels[1]) << what << " (the norm launch folded)";
          }
    }
}

// Round 11: the add_rmsnorm / rmsnorm fused into the warp site of prefill rows (Options::site_norm_warp,
// site_norm_warp_kernel) against the unfused norm_kernel + site_warp_kernel: the residual, the normed x, the fp32
// site and the linear's outputs are EQUAL (norm_kernel's pass and sum order, then the warp site's stages), at 64 and
// 131 rows, K from one 1024 chunk (a 256-thread norm block) to 8 chunks, FWHT blocks of 1024 and 128,
// with and without the residual add, q16 and q8; the fused path launches one kernel fewer per norm.
TEST(CudaSite, NormWarpEqualsUnfusedNormAndWarpSite) {
  BONSAI_REQUIRE_GPU();
  for (const int levels : {2, 1})
    for (const int64_t K : {int64_t(5120), int64_t(1024), int64_t(8192)}) {
      TernaryMatrix& w = random_matrix(96, K, uint32_t(300 + K / 1024), 0.02);
      const auto s = random_signs(size_t(K), 301);
      const auto gain = uniform(size_t(K), 302, 0.5f, 1.5f);
      CudaBackend::Options on, off;
      on.site_norm_warp = true;
      off.site_norm_warp = false;
      on.row_units = off.row_units = false;  // the fused norm site has no row-unit form (site_row_units): per group
      on.act_levels = off.act_levels = levels;
      CudaBackend fused(on), plain(off);
      for (const int64_t rows : {int64_t(64), int64_t(131)})
        for (const int64_t n : {int64_t(1024), int64_t(128)})
          for (const bool add : {true, false}) {
            const auto h0 = randn(size_t(rows * K), uint32_t(303 + rows), 2.f), d0 = randn(size_t(rows * K), uint32_t(304 + rows));
            expect_norm_folded(fused, plain, w, s, gain, h0, d0, rows, K, n, add, levels);
          }
    }
  // Where it applies: prefill rows, K % 1024 == 0 up to 8 chunks, n <= 1024, a gain, the warp site on.
  cuda::SiteDesc d;
  d.pre = cuda::kPreAddNorm;
  d.gain = reinterpret_cast<const float*>(uintptr_t(256));
  d.rows = 64;
  d.K = d.ld = 5120;
  d.n = 1024;
  EXPECT_TRUE(cuda::site_norm_warp_supported(d));
  d.rows = 32;
  EXPECT_FALSE(cuda::site_norm_warp_supported(d));
  d.rows = 256;
  d.K = d.ld = 9216;
  EXPECT_FALSE(cuda::site_norm_warp_supported(d));
  d.K = d.ld = 5120;
  d.n = 2048;
  EXPECT_FALSE(cuda::site_norm_warp_supported(d));
  d.n = 1024;
  d.warp = false;
  EXPECT_FALSE(cuda::site_norm_warp_supported(d));
  d.warp = true;
  d.pre = cuda::kPreSiluMul;
  EXPECT_FALSE(cuda::site_norm_warp_supported(d));
}

// Round 9: the site_kernel FWHT with strides 32..n/2 as shuffles after one transpose (Options::site_xpose 1; 2:
// also no barrier before it for elementwise pre-ops, quantised from the transpose) against the shared-memory stages, at decode row counts (1, 5, 32: site_kernel, not the warp site): the same
// butterflies in the same order, so every output is EQUAL, for every pre-op, FWHT blocks 1024 / 256 / 64 / 16
// (16: no transpose), a short last tile (K = 3584 = 3.5 tiles), and the inverse transform.
TEST(CudaSite, TransposedStagesEqualSharedMemoryStages) {
  BONSAI_REQUIRE_GPU();
  const int64_t Dv = 128;
  for (const int64_t K : {int64_t(5120), int64_t(3584)}) {
    TernaryMatrix& w = random_matrix(64, K, uint32_t(300 + K / 512), 0.02);
    const auto s = random_signs(size_t(K), 301);
    const auto gain = uniform(size_t(Dv), 302, 0.5f, 1.5f);
    std::vector<int32_t> perm(static_cast<size_t>(K));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(303));
    for (const int xpose : {1, 2}) {
      CudaBackend::Options on, off;
      on.site_xpose = xpose;
      off.site_xpose = 0;
      CudaBackend xp(on), sm(off);
      for (const int64_t rows : {int64_t(1), int64_t(5), int64_t(32)}) {
        const auto a = randn(size_t(rows * K), uint32_t(304 + rows)), b = randn(size_t(rows * K), uint32_t(305 + rows));
        for (const int64_t n : {int64_t(1024), int64_t(256), int64_t(64), int64_t(16)}) {
          if (K % n != 0) continue;
          for (int kind = 0; kind < 5; ++kind) {  // silu*up, x*sigmoid(g), gated norm, plain rotate, gather + rotate
            const SiteRun r[2] = {run_site(xp, kind, w, s, perm, gain, a, b, rows, K, Dv, n),
                                  run_site(sm, kind, w, s, perm, gain, a, b, rows, K, Dv, n)};
            const std::string what = "xpose " + std::to_string(xpose) + " K " + std::to_string(K) + " rows " +
                                     std::to_string(rows) + " n " + std::to_string(n) + " kind " + std::to_string(kind);
            EXPECT_EQ(r[0].site, r[1].site) << what;
            EXPECT_EQ(r[0].y, r[1].y) << what;
            EXPECT_EQ(r[0].inv, r[1].inv) << what;
          }
        }
      }
    }
  }
}

// Round 11: the decode-row site (Options::site_row, site_row.cu: a 128-thread block per 1024 elements, 8 a thread,
// strides 256 / 512 in one shared-memory exchange) against site_kernel at 1, 5 and 32 rows: the fp32 site, the
// producer's own output (written by the row site as site_kernel writes it), the linear's outputs and the inverse are
// EQUAL for the elementwise pre-ops and the plain rotate, the gated norm within 1e-5 / 1e-3 (its sum of squares in
// another order); FWHT blocks 1024 (both exchange strides), 512 (one), 128 and 16 (none); q8 and q16; the gather
// (not supported: site_kernel runs) equal as well.
TEST(CudaSite, RowSiteEqualsTheBlockSiteKernel) {
  BONSAI_REQUIRE_GPU();
  const int64_t K = 3072, Dv = 128;
  TernaryMatrix& w = random_matrix(300, K, 191, 0.02);
  const auto s = random_signs(size_t(K), 195);
  const auto gain = uniform(size_t(Dv), 194, 0.5f, 1.5f);
  std::vector<int32_t> perm(static_cast<size_t>(K));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(196));
  for (const int levels : {1, 2}) {
    CudaBackend::Options on, off;
    on.site_row = true;
    off.site_row = false;
    on.act_levels = off.act_levels = levels;
    CudaBackend row(on), block(off);
    for (const int64_t rows : {int64_t(1), int64_t(5), int64_t(32)}) {
      const auto a = randn(size_t(rows * K), 192 + uint32_t(rows)), b = randn(size_t(rows * K), 193 + uint32_t(rows));
      for (int64_t n : {int64_t(1024), int64_t(512), int64_t(128), int64_t(16)})
        for (int kind = 0; kind < 5; ++kind) {  // silu*up, x*sigmoid(g), gated norm, plain rotate, gather + rotate
          const SiteRun r[2] = {run_site(row, kind, w, s, perm, gain, a, b, rows, K, Dv, n),
                                run_site(block, kind, w, s, perm, gain, a, b, rows, K, Dv, n)};
          const std::string what = "levels " + std::to_string(levels) + " rows " + std::to_string(rows) + " n " +
                                   std::to_string(n) + " kind " + std::to_string(kind);
          for (float v : r[0].y) ASSERT_TRUE(std::isfinite(v)) << what;  // poison: every output written
          if (kind == 2) {
            EXPECT_LE(rel_err(r[0].site, r[1].site), 1e-5) << what;
            EXPECT_LE(rel_err(r[0].y, r[1].y), 1e-3) << what;
            EXPECT_LE(rel_err(r[0].prod, r[1].prod), 1e-5) << what << " (producer output)";
          } else {
            EXPECT_EQ(r[0].site, r[1].site) << what;
            EXPECT_EQ(r[0].y, r[1].y) << what;
            EXPECT_EQ(r[0].prod, r[1].prod) << what << " (producer output)";
          }
          EXPECT_LE(rel_err(r[0].inv, r[1].inv), kind == 2 ? 1e-5 : 0.0) << what << " (inverse)";
        }
    }
  }
  cuda::SiteDesc d;  // what the row site takes
  d.rows = 1;
  d.K = d.ld = 5120;
  d.n = 1024;
  d.xq = reinterpret_cast<int8_t*>(16);
  d.xds = reinterpret_cast<float2*>(16);
  EXPECT_TRUE(cuda::site_row_supported(d));
  d.rows = 64;  // prefill rows: the warp site
  EXPECT_FALSE(cuda::site_row_supported(d));
  d.rows = 1;
  d.pre = cuda::kPreAddNorm;  // the norm needs the whole row: the cluster site
  EXPECT_FALSE(cuda::site_row_supported(d));
  d.pre = cuda::kPreNone;
  d.K = d.ld = 5120 + 128;  // not whole 1024-blocks
  EXPECT_FALSE(cuda::site_row_supported(d));
}
