// Every CudaBackend op against the reference op (bonsai::ref, fp64) on random inputs with odd sizes and
// tails; outputs are poisoned (NaN) first so unwritten elements fail. Skipped without a CUDA device.
//
// Tolerances (max |got - want| / max |want|):
//   fp32 ops (norms, FWHT, RoPE, attention, GDN, dense, copies)            1e-5 .. 2e-4 (stated per test)
//   ternary products vs the exact quantised-activation reference          1e-4 (the kernels' own arithmetic;
//                                                                           q16 default and q8)
//   ternary products vs ref (fp64, unquantised x), per output of sum |w x| q16 1e-4 (digit error <= d/508:
//                                                                           at most ~5e-5 even if every
//                                                                           rounding aligned; a lost digit is
//                                                                           ~3e-3), q8 1e-2
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <numeric>
#include <tuple>
#include <utility>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemm3_fold.h"
#include "backend/cuda/kernels.h"
#include "backend/ref/ops.h"
#include "backend/ref/ref_backend.h"
#include "cuda_test_util.h"
#include "util/error.h"

namespace bonsai {
namespace {

using namespace cudatest;

TEST(CudaOps, NoDeviceIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a device is present";
  EXPECT_THROW({ CudaBackend b; }, Error);
  try {
    CudaBackend b;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
}

TEST(CudaOps, MemoryRoundTripAndZero) {
  BONSAI_REQUIRE_GPU();
  CudaBackend& be = gpu();
  Buffer z(be, 1001);
  EXPECT_EQ(down(be, z), std::vector<float>(1001, 0.f));  // allocate zero-fills
  const auto v = randn(1001, 1);
  be.copy_from_host(v.data(), v.size(), z.data());
  EXPECT_EQ(down(be, z), v);
  be.zero(z.data(), 1001);
  EXPECT_EQ(down(be, z), std::vector<float>(1001, 0.f));
}

TEST(CudaOps, HadamardForwardInverse) {
  BONSAI_REQUIRE_GPU();
  CudaBackend& be = gpu();
  struct Case {
    int64_t rows, K, block;
    bool signs;
  } cases[] = {{3, 3072, 1024, true}, {2, 384, 128, true}, {5, 5120, 1024, false}, {1, 96, 16, true},
               {2, 8192, 8192, true}, {4, 1152, 64, true}};
  for (const Case& c : cases) {
    const auto x = randn(size_t(c.rows * c.K), uint32_t(c.K));
    const auto s = random_signs(size_t(c.K), 9);
    Buffer sd = up_bytes(be, s);
    const int8_t* sp = c.signs ? reinterpret_cast<const int8_t*>(sd.data()) : nullptr;
    for (int inv = 0; inv < 2; ++inv) {
      auto want = x;
      if (inv) ref::hadamard_inverse(want.data(), c.rows, c.K, c.signs ? s.data() : nullptr, c.block);
      else ref::hadamard_forward(want.data(), c.rows, c.K, c.signs ? s.data() : nullptr, c.block);
      Buffer d = up(be, x);
      if (inv) be.hadamard_inverse(d.data(), c.rows, c.K, sp, c.block);
      else be.hadamard_forward(d.data(), c.rows, c.K, sp, c.block);
      EXPECT_LE(rel_err(down(be, d), want), 1e-5) << "rows " << c.rows << " K " << c.K << " n " << c.block << " inv " << inv;
    }
  }
}

// The site fusions: producer op + copy / permute + hadamard_forward in one kernel must equal the ops
// one by one (including the producer's own output buffer).
TEST(CudaOps, SiteFusionsMatchTheOpSequence) {
  BONSAI_REQUIRE_GPU();
  CudaBackend& be = gpu();
  const int64_t rows = 3, K = 3072, n = 1024, Dv = 128;
  const auto a = randn(size_t(rows * K), 1), b = randn(size_t(rows * K), 2), gain = uniform(size_t(Dv), 3, 0.5f, 1.5f);
  const auto s = random_signs(size_t(K), 4);
  std::vector<int32_t> perm(static_cast<size_t>(K));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
  Buffer sd = up_bytes(be, s), pd = up_bytes(be, perm), gd = up(be, gain);
  const auto* sp = reinterpret_cast<const int8_t*>(sd.data());
  const auto* pp = reinterpret_cast<const int32_t*>(pd.data());
  for (int kind = 0; kind < 5; ++kind) {
    std::vector<float> pre = a, want(size_t(rows * K));
    if (kind == 0) ref::silu_mul(a.data(), b.data(), rows * K, pre.data());
    if (kind == 1) ref::sigmoid_gate_mul(pre.data(), b.data(), rows * K);
    if (kind == 2) ref::gated_rmsnorm(a.data(), b.data(), gain.data(), rows * K / Dv, Dv, 1e-6f, pre.data());
    if (kind == 4)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < K; ++i) want[size_t(r * K + i)] = pre[size_t(r * K + perm[size_t(i)])];
    else want = pre;
    ref::hadamard_forward(want.data(), rows, K, s.data(), n);

    Buffer da = up(be, a), db = up(be, b), site = poisoned(be, size_t(rows * K));
    if (kind == 0) be.silu_mul(da.data(), db.data(), rows * K, da.data());
    if (kind == 1) be.sigmoid_gate_mul(da.data(), db.data(), rows * K);
    if (kind == 2) be.gated_rmsnorm(da.data(), db.data(), gd.data(), rows * K / Dv, Dv, 1e-6f, da.data());
    if (kind == 4) be.permute_cols(da.data(), rows, K, pp, site.data());
    else be.copy_rows(site.data(), K, da.data(), K, rows, K);
    be.hadamard_forward(site.data(), rows, K, sp, n);
    EXPECT_LE(rel_err(down(be, site), want), 2e-5) << "kind " << kind;
    EXPECT_LE(rel_err(down(be, da), pre), 2e-5) << "producer output, kind " << kind;
  }
}

// A one-row site (producer op -> copy -> sign + FWHT) followed by the M = 1 linear that reads it: with
// Options::fuse_site the matvec computes the site as its prologue (warp_site.cuh; q8 only). Its int8
// activation is the site kernel's bit for bit for the elementwise pre-ops, so the outputs are EQUAL to the
// unfused backend's; the gated norm sums its squares in another order (<= 1e-3 relative). Also n < 1024
// (FWHT blocks smaller than the 1024 chunk) and two weight matrices sharing the site. Under q16 the
// switch falls back to the site kernel: outputs equal to the plain q16 backend's.
TEST(CudaOps, SiteFusedIntoMatvecMatchesTheSiteKernel) {
  BONSAI_REQUIRE_GPU();
  for (const int levels : {1, 2}) {
  CudaBackend::Options on, off;
  on.fuse_site = true;
  off.fuse_site = false;
  on.act_levels = off.act_levels = levels;
  on.matvec = off.matvec = 3;  // the prologue is v3's; v6 (the default since round 8) sums in another order
  CudaBackend fused(on), plain(off);
  const int64_t K = 3072, Dv = 128;
  TernaryMatrix& w0 = random_matrix(700, K, 71, 0.02);
  TernaryMatrix& w1 = random_matrix(129, K, 72, 0.02);
  const auto a = randn(size_t(K), 81), b = randn(size_t(K), 82), gain = uniform(size_t(Dv), 83, 0.5f, 1.5f);
  const auto s = random_signs(size_t(K), 84);
  for (int64_t n : {int64_t(1024), int64_t(256), int64_t(64)}) {
    for (int kind = 0; kind < 4; ++kind) {  // silu*up, x*sigmoid(g), gated norm, plain rotate
      std::vector<float> y[2];
      for (CudaBackend* be : {&fused, &plain}) {
        be->prepare_matrix(w0);
        be->prepare_matrix(w1);
        Buffer sd = up_bytes(*be, s), gd = up(*be, gain);
        Buffer da = up(*be, a), db = up(*be, b), site = poisoned(*be, size_t(K));
        Buffer y0 = poisoned(*be, size_t(w0.rows)), y1 = poisoned(*be, size_t(w1.rows));
        if (kind == 0) be->silu_mul(da.data(), db.data(), K, da.data());
        if (kind == 1) be->sigmoid_gate_mul(da.data(), db.data(), K);
        if (kind == 2) be->gated_rmsnorm(da.data(), db.data(), gd.data(), K / Dv, Dv, 1e-6f, da.data());
        be->copy_rows(site.data(), K, da.data(), K, 1, K);
        be->hadamard_forward(site.data(), 1, K, reinterpret_cast<const int8_t*>(sd.data()), n);
        const LinearOut outs[2] = {{&w0, y0.data()}, {&w1, y1.data()}};
        be->linear(outs, 2, K, site.data(), 1);
        auto v0 = down(*be, y0), v1 = down(*be, y1);
        v0.insert(v0.end(), v1.begin(), v1.end());
        y[be == &plain] = v0;
      }
      const std::string what = "levels " + std::to_string(levels) + " n " + std::to_string(n) + " kind " + std::to_string(kind);
      if (kind == 2 && levels == 1) EXPECT_LE(rel_err(y[0], y[1]), 1e-3) << what;
      else EXPECT_EQ(y[0], y[1]) << what;
    }
  }
  }
}

// One product of n (1 or 2) outputs sharing x [M, K] on be, outputs poisoned first: {y0, y1} (y1 still poisoned when
// n = 1), expecting every element of the n outputs written.
using Pair = std::pair<std::vector<float>, std::vector<float>>;
Pair paired_linear(CudaBackend& be, TernaryMatrix& w0, TernaryMatrix& w1, int n, const std::vector<float>& x, int64_t M,
                   const std::string& what) {
  be.prepare_matrix(w0);
  be.prepare_matrix(w1);
  Buffer dx = up(be, x), y0 = poisoned(be, size_t(M * w0.rows)), y1 = poisoned(be, size_t(M * w1.rows));
  const LinearOut outs[2] = {{&w0, y0.data()}, {&w1, y1.data()}};
  be.linear(outs, n, w0.cols, dx.data(), M);
  std::vector<float> v[2] = {down(be, y0), down(be, y1)};
  int64_t unwritten = 0;  // poison: every output written
  for (int i = 0; i < n; ++i)
    unwritten += std::count_if(v[i].begin(), v[i].end(), [](float e) { return !std::isfinite(e); });
  EXPECT_EQ(unwritten, 0) << what;
  return {v[0], v[1]};
}
// The n outputs of two paired_linear results are EQUAL.
bool same_outputs(const Pair& a, const Pair& b, int n) { return a.first == b.first && (n == 1 || a.second == b.second); }

// A GEMM test case of paired_linear: random ternary w0 [N0, K] and w1 [N1, K] (N1 = 0: one output, w1 a 1-row stand-in)
// and x [M, K], drawn from seed in that order, with its label.
struct PairedCase {
  TernaryMatrix& w0;
  TernaryMatrix& w1;
  int n;
  std::vector<float> x;
  std::string what;
};
PairedCase paired_case(int levels, int64_t M, int64_t K, int64_t N0, int64_t N1, uint32_t& seed) {
  TernaryMatrix& w0 = random_matrix(N0, K, seed++, 0.02);
  TernaryMatrix& w1 = random_matrix(N1 > 0 ? N1 : 1, K, seed++, 0.02);
  std::vector<float> x = randn(size_t(M * K), seed++);
  return {w0, w1, N1 > 0 ? 2 : 1, std::move(x),
          "levels " + std::to_string(levels) + " M " + std::to_string(M) + " K " + std::to_string(K) + " N " +
              std::to_string(N0) + "+" + std::to_string(N1)};
}

// GEMM v3's int -> float conversions of the per-group scaling (Options::gemm3_cvt: 0 = the 1.5 x 2^23 mantissa add,
// 1 = I2FP) are both exact, so the outputs are EQUAL, at each token tile (32 / 64 / 128), with
// ragged M and N, paired outputs and split-K (K = 8192 with few rows), q16 and q8, with per-group units and row units
// (whose 64- and 128-token instances are I2FP only: there both backends run the same kernel, so EQUAL run to run).
TEST(CudaOps, GemmV3ConversionsAgree) {
  BONSAI_REQUIRE_GPU();
  for (const bool ru : {true, false})
  for (const int levels : {1, 2}) {
    CudaBackend::Options o[2];
    for (int c = 0; c < 2; ++c) {
      o[c].gemm = 3;
      o[c].gemm3_cvt = c;
      o[c].act_levels = levels;
      o[c].row_units = ru;
    }
    CudaBackend b0(o[0]), b1(o[1]);
    CudaBackend* bes[2] = {&b0, &b1};
    uint32_t seed = 900;
    for (const auto& [M, K, N0, N1] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{29, 1152, 257, 75},
                                       {61, 640, 130, 3}, {200, 1152, 300, 129}, {40, 8192, 200, 40},
                                       {130, 5120, 400, 0}, {64, 2048, 300, 129}}) {
      TernaryMatrix& w0 = random_matrix(N0, K, seed++, 0.02);
      TernaryMatrix& w1 = random_matrix(N1 > 0 ? N1 : 1, K, seed++, 0.02);
      const int n = N1 > 0 ? 2 : 1;
      const auto x = randn(size_t(M * K), seed++);
      std::vector<float> y[2];
      for (int c = 0; c < 2; ++c) {
        const std::string what = "cvt " + std::to_string(c) + " ru " + std::to_string(ru) + " levels " +
                                 std::to_string(levels) + " M " + std::to_string(M) + " K " + std::to_string(K);
        auto [v0, v1] = paired_linear(*bes[c], w0, w1, n, x, M, what);
        if (n == 2) v0.insert(v0.end(), v1.begin(), v1.end());
        y[c] = v0;
      }
      const std::string what = "ru " + std::to_string(ru) + " levels " + std::to_string(levels) + " M " +
                               std::to_string(M) + " K " + std::to_string(K);
      EXPECT_EQ(y[0], y[1]) << what;
    }
  }
}

// Round 11b: GEMM v3 with its split-K folded in (Options::gemm3_fold). Below one wave of tiles (and at a last wave of
// more than half the SMs: 200 tiles) every tile is split as the unfused path splits it and the last block of each tile
// sums the slices in the sum kernel's order: EQUAL to the unfused GEMM + splitk_sum. From one wave up (shapes sized for
// 132 SMs: 134 tiles) only the last wave's tiles are split (2-8 slices): another fp32 summation order, so vs the exact
// int8 product (quantised_reference) <= 1e-5 and vs the unfused GEMM <= 2e-6. Ragged M and N, paired outputs, token
// tiles 32, 64 and 128, q16 and q8; every output written (poison); two runs EQUAL (the counters are left at zero, the
// sum order does not depend on which block is last).
TEST(CudaOps, GemmV3FoldedSplitMatchesUnfusedAndQuantisedReference) {
  BONSAI_REQUIRE_GPU();
  for (const int levels : {2, 1}) {
    CudaBackend::Options on, off;
    on.gemm = off.gemm = 3;
    on.gemm3_fold = true;
    off.gemm3_fold = false;
    on.gemm3_occ = off.gemm3_occ = 1;  // the shapes are sized for one block per SM (GemmV3TwoBlocksPerSm* has two)
    on.act_levels = off.act_levels = levels;
    CudaBackend bon(on), boff(off);
    uint32_t seed = 1900;
    struct Case {
      int64_t M, K, N0, N1;
      bool tail;  // >= one wave of tiles on 132 SMs: checked against quantised_reference
    } cases[] = {{40, 8192, 200, 40, false}, {130, 4096, 200, 40, false}, {29, 8192, 257, 75, false},
                 {20, 8192, 25400, 100, false},
                 {20, 4096, 17000, 100, true}, {40, 1024, 17000, 100, true}, {130, 1024, 8300, 129, true}};
    for (const Case& c : cases) {
      TernaryMatrix& w0 = random_matrix(c.N0, c.K, seed++, 0.02);
      TernaryMatrix& w1 = random_matrix(c.N1, c.K, seed++, 0.02);
      const auto x = randn(size_t(c.M * c.K), seed++);
      const std::string what = "levels " + std::to_string(levels) + " M " + std::to_string(c.M) + " K " +
                               std::to_string(c.K) + " N " + std::to_string(c.N0) + "+" + std::to_string(c.N1);
      auto run = [&](CudaBackend& be) { return paired_linear(be, w0, w1, 2, x, c.M, what); };
      const auto a = run(bon), b = run(bon), u = run(boff);
      EXPECT_TRUE(a == b) << "run to run, " << what;
      if (!c.tail) {
        EXPECT_TRUE(a == u) << "folded vs unfused, " << what;
        continue;
      }
      const bool ru = bon.row_quantised(c.M, c.K);
      const auto e0 = quantised_reference(w0, x, c.M, levels, ru), e1 = quantised_reference(w1, x, c.M, levels, ru);
      const double r0 = rel_err(a.first, e0), r1 = rel_err(a.second, e1);
      const double d0 = rel_err(a.first, u.first), d1 = rel_err(a.second, u.second);
      EXPECT_LE(r0, 1e-5) << what;
      EXPECT_LE(r1, 1e-5) << what;
      EXPECT_LE(d0, 2e-6) << what;
      EXPECT_LE(d1, 2e-6) << what;
      std::printf("[fold] %s: vs quantised %.2e / %.2e (unfused %.2e / %.2e), vs unfused %.2e / %.2e\n",
                  what.c_str(), r0, r1, rel_err(u.first, e0), rel_err(u.second, e1), d0, d1);
    }
  }
}

// Round 17: GEMM v3 at two blocks per SM (Options::gemm3_occ 2, 9 <= M <= 32: 7 stages, 96-register consumers) computes
// the same per-tile sums as one block per SM; only the split-K / folded-split plans may differ (twice the slots), so
// where both plans leave every tile whole the outputs are EQUAL, elsewhere within fp32 summation of the exact int8
// product (quantised_reference). Ragged M and N, paired outputs, q16 and q8, every output written, two runs EQUAL.
TEST(CudaOps, GemmV3TwoBlocksPerSmMatchesOneBlock) {
  BONSAI_REQUIRE_GPU();
  for (const int levels : {2, 1}) {
    CudaBackend::Options one, two;
    one.gemm = two.gemm = 3;
    one.gemm3_occ = 1;
    two.gemm3_occ = 2;
    one.act_levels = two.act_levels = levels;
    CudaBackend b1(one), b2(two);
    const int sms = b1.sm_count();
    uint32_t seed = 3100;
    struct Case {
      int64_t M, K, N0, N1;
    } cases[] = {{32, 5120, 4000, 4000}, {29, 1152, 257, 75}, {17, 6144, 5120, 0}, {9, 8192, 200, 40},
                 {12, 1024, 40000, 129}, {31, 17408, 5120, 0}};
    for (const Case& c : cases) {
      if (levels == 1 && c.M <= 4) continue;  // the q8 matvec's
      auto [w0, w1, n, x, what] = paired_case(levels, c.M, c.K, c.N0, c.N1, seed);
      const auto a = paired_linear(b2, w0, w1, n, x, c.M, what), b = paired_linear(b2, w0, w1, n, x, c.M, what);
      const auto u = paired_linear(b1, w0, w1, n, x, c.M, what);
      EXPECT_TRUE(same_outputs(a, b, n)) << "run to run, " << what;
      cuda::TernaryDev t[2] = {{nullptr, nullptr, nullptr, c.N0}, {nullptr, nullptr, nullptr, c.N1}};
      auto whole = [&](int occ) {
        const cuda::Gemm3Fold f = cuda::gemm3_fold_plan(t, n, c.K, c.M, levels, sms, occ);
        return f.kt <= 1 && cuda::gemm3_ksplit(t, n, c.K, c.M, levels, sms, occ) == 1;
      };
      const double r0 = rel_err(a.first, quantised_reference(w0, x, c.M, levels));
      EXPECT_LE(r0, 1e-5) << what;
      if (n == 2) EXPECT_LE(rel_err(a.second, quantised_reference(w1, x, c.M, levels)), 1e-5) << what;
      if (whole(1) && whole(2)) EXPECT_TRUE(same_outputs(a, u, n)) << "vs one block, " << what;
      else EXPECT_LE(rel_err(a.first, u.first), 2e-6) << what;
      std::printf("[gemm3 occ2] %s: vs quantised %.2e, vs one block %.2e (%s)\n", what.c_str(), r0,
                  rel_err(a.first, u.first), whole(1) && whole(2) ? "no split: EQUAL" : "split plans differ");
    }
  }
}

// Round 25: which GEMM v3 instance a batched-decode product gets (host only: runs in CI). 132 SMs (the H200), 32
// tokens: the rule-5 split puts gate+up (272 tiles) and the head on two blocks per SM and the products of fewer than 2
// tiles per SM (ffn_down 40, qkv+z 128) on the double-buffered one; outside 9..32 tokens always one block.
TEST(CudaPolicy, GemmV3BlocksPerSmRule) {
  const int sms = 132;
  auto occ = [&](int opt, std::initializer_list<int64_t> ns, int64_t K, int64_t M) {
    cuda::TernaryDev t[3] = {};
    int n = 0;
    for (const int64_t N : ns) t[n++].N = N;
    return cuda::gemm3_occ_rule(opt, t, n, K, M, 2, sms);
  };
  EXPECT_EQ(occ(5, {17408, 17408}, 5120, 32), 2);  // gate+up
  EXPECT_EQ(occ(5, {248320}, 5120, 32), 2);        // head
  EXPECT_EQ(occ(5, {5120}, 17408, 32), 4);         // ffn_down
  EXPECT_EQ(occ(5, {10240, 6144}, 5120, 16), 4);   // qkv+z
  EXPECT_EQ(occ(2, {17408, 17408}, 5120, 32), 2);  // round 17's rule: more blocks than SMs
  EXPECT_EQ(occ(3, {5120}, 17408, 9), 3);
  EXPECT_EQ(occ(4, {17408, 17408}, 5120, 32), 4);
  EXPECT_EQ(occ(1, {17408, 17408}, 5120, 32), 1);
  for (const int opt : {1, 2, 3, 4, 5}) {
    EXPECT_EQ(occ(opt, {17408, 17408}, 5120, 8), 1) << opt;   // the batch kernels' and one block's range
    EXPECT_EQ(occ(opt, {17408, 17408}, 5120, 33), 1) << opt;  // 64-token tiles
  }
}

// Round 25: the one-block instance with double-buffered accumulators (Options::gemm3_occ 3 with the turn-taking, 4
// without) runs the same plan as one block per SM (occ 1) and adds the same group sums in the same order: EQUAL to it,
// and within fp32 summation of the exact int8 product. Groups per block odd and even, one group (K = 128), split and
// folded-split plans, ragged M and N, paired outputs, q16 and q8; two runs EQUAL.
TEST(CudaOps, GemmV3DoubleBufferedEqualsOneBlock) {
  BONSAI_REQUIRE_GPU();
  for (const int levels : {2, 1}) {
    CudaBackend::Options one;
    one.gemm = 3;
    one.gemm3_occ = 1;
    one.act_levels = levels;
    CudaBackend b1(one);
    uint32_t seed = 3500;
    struct Case {
      int64_t M, K, N0, N1;
    } cases[] = {{32, 5120, 4000, 4000}, {29, 1152, 257, 75}, {17, 6144, 5120, 0}, {9, 128, 300, 0},
                 {12, 1024, 40000, 129}, {31, 17408, 5120, 0}, {24, 384, 999, 0}};
    for (const Case& c : cases) {
      auto [w0, w1, n, x, what] = paired_case(levels, c.M, c.K, c.N0, c.N1, seed);
      const auto u = paired_linear(b1, w0, w1, n, x, c.M, what);
      const double r0 = rel_err(u.first, quantised_reference(w0, x, c.M, levels));
      EXPECT_LE(r0, 1e-5) << what;
      for (const int occ : {3, 4}) {
        CudaBackend::Options o = one;
        o.gemm3_occ = occ;
        CudaBackend bd(o);
        const auto a = paired_linear(bd, w0, w1, n, x, c.M, what), b = paired_linear(bd, w0, w1, n, x, c.M, what);
        EXPECT_TRUE(same_outputs(a, b, n)) << "run to run, occ " << occ << ", " << what;
        EXPECT_TRUE(same_outputs(a, u, n)) << "vs one block, occ " << occ << ", " << what;
        std::printf("[gemm3 db occ %d] %s: vs quantised %.2e, vs one block %.2e\n", occ, what.c_str(), r0,
                    rel_err(a.first, u.first));
      }
    }
  }
}

// Round 19 (Options::row_units): at prefill rows the warp site quantises each row with ONE unit and GEMM v3 scales a
// group by d_w alone and each output by its token's unit once. Against the exact int8 product of the row-quantised
// digits (quantised_reference with row units) <= 1e-5 for token tiles 64 and 128, ragged M and N, paired outputs, K
// of 1 to 17 chunks (ffn_down's), split and folded-split plans, q16 and q8; every output written, two runs EQUAL. Each
// row holds one outlier (30x), so the row unit is coarse: the per-group reference must then be far off (the row units
// were really used), and the per-group backend (row_units off) must still match that one.
TEST(CudaOps, GemmV3RowUnitsMatchTheRowQuantisedReference) {
  BONSAI_REQUIRE_GPU();
  for (const int levels : {2, 1}) {
    CudaBackend::Options ru, pg;
    ru.row_units = true;
    pg.row_units = false;
    ru.act_levels = pg.act_levels = levels;
    CudaBackend bru(ru), bpg(pg);
    uint32_t seed = 4100;
    struct Case {
      int64_t M, K, N0, N1;
    } cases[] = {{64, 1024, 300, 129}, {130, 5120, 2000, 77}, {300, 6144, 520, 0}, {64, 17408, 200, 0},
                 {97, 4096, 17000, 100}, {257, 2048, 130, 3}};
    for (const Case& c : cases) {
      auto [w0, w1, n, x, what] = paired_case(levels, c.M, c.K, c.N0, c.N1, seed);
      for (int64_t m = 0; m < c.M; ++m) x[size_t(m * c.K + (m * 37) % c.K)] *= 30.f;  // one outlier per row
      const auto a = paired_linear(bru, w0, w1, n, x, c.M, what), b = paired_linear(bru, w0, w1, n, x, c.M, what);
      EXPECT_TRUE(same_outputs(a, b, n)) << "run to run, " << what;
      const auto er = quantised_reference(w0, x, c.M, levels, true), eg = quantised_reference(w0, x, c.M, levels);
      const double r0 = rel_err(a.first, er), g0 = rel_err(a.first, eg);
      EXPECT_LE(r0, 1e-5) << what;
      EXPECT_GE(g0, 20 * r0 + 1e-6) << "the row units were not used? " << what;
      if (n == 2) EXPECT_LE(rel_err(a.second, quantised_reference(w1, x, c.M, levels, true)), 1e-5) << what;
      const auto p = paired_linear(bpg, w0, w1, n, x, c.M, what);
      EXPECT_TRUE(bru.row_quantised(c.M, c.K) && !bpg.row_quantised(c.M, c.K)) << what;
      EXPECT_LE(rel_err(p.first, eg), 1e-5) << "per-group units, " << what;
      std::printf("[gemm3 row units] %s: vs the row-unit product %.2e, vs the per-group product %.2e (group units %.2e)\n",
                  what.c_str(), r0, g0, rel_err(p.first, eg));
    }
  }
}

// GEMM v4 (round 13, Options::gemm_f16): the fp16 activation tiles (xh_pack) and the fp16 wgmma product with the scales
// folded into the weights, against f16_reference (the same digits in fp16, exact weights, double sums): every block
// shape, ragged M and N, paired outputs, the folded split (every tile split: small grids over a long K; the last wave's
// tiles split: N 17,000 + 100 at 130 tokens, 268 tiles of 128 x 128), q16 and q8,
// every output written, two runs EQUAL. Also within fp16's precision of the q16 product (quantised_reference).
struct GemmF16Case {
  int64_t M, K, N0, N1;  // N1 = 0: one output
};
// M >= 5: the f16 path under q8 too (M <= 4 is the q8 matvec's).
void check_gemm_f16(const std::vector<GemmF16Case>& cases) {
  for (const int levels : {2, 1})
  for (const int tile : {0, 2, 3, 4}) {  // the shape gemmh_plan picks, then each M > 32 shape forced (q16 only)
    if (levels == 1 && tile > 0) continue;
    CudaBackend::Options on;
    on.gemm_f16 = 1;
    on.gemm_f16_all = true;
    on.gemm_f16_tile = tile;
    on.act_levels = levels;
    CudaBackend be(on);
    uint32_t seed = 2600;
    for (const GemmF16Case& c : cases) {
      if (tile > 0 && c.M <= 32) continue;
      TernaryMatrix& w0 = random_matrix(c.N0, c.K, seed++, 0.02);
      TernaryMatrix& w1 = random_matrix(c.N1 > 0 ? c.N1 : 1, c.K, seed++, 0.02);
      const int n = c.N1 > 0 ? 2 : 1;
      const auto x = randn(size_t(c.M * c.K), seed++);
      const std::string what = "levels " + std::to_string(levels) + " tile " + std::to_string(tile) + " M " +
                               std::to_string(c.M) + " K " + std::to_string(c.K) + " N " + std::to_string(c.N0) + "+" +
                               std::to_string(c.N1);
      auto run = [&] { return paired_linear(be, w0, w1, n, x, c.M, what); };
      const auto a = run(), b = run();
      EXPECT_TRUE(same_outputs(a, b, n)) << "run to run, " << what;
      const bool ru = be.row_quantised(c.M, c.K);
      const auto e0 = f16_reference(w0, x, c.M, levels, ru), q0 = quantised_reference(w0, x, c.M, levels, ru);
      const double r0 = rel_err(a.first, e0), d0 = rel_err(a.first, q0);
      EXPECT_LE(r0, 1e-5) << what;  // fp32 sums of exact fp16 products (measured <= 3.6e-6)
      EXPECT_LE(d0, 3e-3) << what;  // the activation's fp16 rounding against the int8 digits' exact product
      double r1 = 0;
      if (n == 2) {
        r1 = rel_err(a.second, f16_reference(w1, x, c.M, levels, ru));
        EXPECT_LE(r1, 1e-5) << what;
      }
      std::printf("[gemm f16] %s: vs f16 reference %.2e / %.2e, vs the int8 product %.2e\n", what.c_str(), r0, r1, d0);
    }
  }
}
TEST(CudaOps, GemmF16MatchesTheF16Reference) {
  BONSAI_REQUIRE_GPU();
  check_gemm_f16({{5, 128, 70, 0}, {17, 1024, 300, 45}, {32, 5120, 1000, 257}, {33, 1024, 129, 0}, {64, 2048, 520, 40},
                  {65, 1024, 200, 3}, {130, 1024, 700, 129}, {256, 5120, 384, 128}, {300, 256, 1030, 0},
                  {40, 8192, 200, 40}, {29, 17408, 257, 75}, {130, 1024, 17000, 100}});
}
// Small shapes of the same for compute-sanitizer: each tile shape, a ragged tail, both kinds of folded split.
TEST(CudaOps, GemmF16Small) {
  BONSAI_REQUIRE_GPU();
  check_gemm_f16({{5, 128, 70, 0}, {33, 1024, 129, 0}, {65, 1024, 200, 3}, {40, 4096, 130, 0}, {130, 1024, 17000, 100}});
}

// Round 14's decode switches (host only): their defaults, and the environment words that turn them off or resize them
// (a negative graph segment is none, one graph per step).
TEST(CudaOps, DecodeSwitchesFromTheEnvironment) {
  const char* names[] = {"BONSAI_CUDA_GRAPH_SEGMENT", "BONSAI_CUDA_DELTA_STEP", "BONSAI_CUDA_ATTN_LONG", "BONSAI_CUDA_MV7_K32",
                         "BONSAI_CUDA_MV7_FIRST",     "BONSAI_CUDA_DELTA_ROWS", "BONSAI_CUDA_PREFILL_CHUNK",
                         "BONSAI_CUDA_DELTA_SPLIT"};
  constexpr int kNames = 8;
  std::string kept[kNames];
  bool had[kNames];
  for (int i = 0; i < kNames; ++i) {
    const char* v = std::getenv(names[i]);
    had[i] = v != nullptr;
    kept[i] = v ? v : "";
    unsetenv(names[i]);
  }
  const CudaBackend::Options d = cuda_options(0, "");
  EXPECT_EQ(d.graph_segment, 64);
  EXPECT_EQ(d.delta_step, 8);
  EXPECT_EQ(d.attn_long, 1);
  EXPECT_EQ(d.matvec7_k32, 1);  // round 15: k32 but on ffn_down
  EXPECT_EQ(d.matvec7_first, -1);  // round 15: the ragged stage first
  EXPECT_EQ(d.delta_rows, 8);       // round 18
  EXPECT_EQ(d.delta_rows_split, 2);  // round 22
  EXPECT_EQ(d.prefill_chunk, 2048);
  setenv("BONSAI_CUDA_GRAPH_SEGMENT", "0", 1);
  setenv("BONSAI_CUDA_DELTA_STEP", "4", 1);
  setenv("BONSAI_CUDA_ATTN_LONG", "0", 1);
  setenv("BONSAI_CUDA_MV7_K32", "0", 1);
  setenv("BONSAI_CUDA_MV7_FIRST", "0", 1);
  const CudaBackend::Options o = cuda_options(0, "");
  EXPECT_EQ(o.graph_segment, 0);
  EXPECT_EQ(o.delta_step, 4);
  EXPECT_EQ(o.attn_long, 0);
  EXPECT_EQ(o.matvec7_k32, 0);
  EXPECT_EQ(o.matvec7_first, 0);
  setenv("BONSAI_CUDA_GRAPH_SEGMENT", "-5", 1);
  EXPECT_EQ(cuda_options(0, "").graph_segment, 0);
  setenv("BONSAI_CUDA_GRAPH_SEGMENT", "200", 1);
  EXPECT_EQ(cuda_options(0, "").graph_segment, 200);
  setenv("BONSAI_CUDA_DELTA_ROWS", "0", 1);
  setenv("BONSAI_CUDA_PREFILL_CHUNK", "1024", 1);
  setenv("BONSAI_CUDA_DELTA_SPLIT", "4", 1);
  EXPECT_EQ(cuda_options(0, "").delta_rows, 0);
  EXPECT_EQ(cuda_options(0, "").delta_rows_split, 4);
  EXPECT_EQ(cuda_options(0, "").prefill_chunk, 1024);
  for (const char* bad : {"100", "0", "8192", "x"}) {
    setenv("BONSAI_CUDA_PREFILL_CHUNK", bad, 1);
    try {
      (void)cuda_options(0, "");
      ADD_FAILURE() << "BONSAI_CUDA_PREFILL_CHUNK=" << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("BONSAI_CUDA_PREFILL_CHUNK"), std::string::npos) << e.what();
    }
  }
  for (int i = 0; i < kNames; ++i) {
    if (had[i]) setenv(names[i], kept[i].c_str(), 1);
    else unsetenv(names[i]);
  }
}

// --act f16 / BONSAI_CUDA_ACT=f16 (host only): GEMM v4 from kF16MinRows rows on q16 digits; --act overrides the
// environment; an unknown word names the known ones.
TEST(CudaOps, ActivationPrecisionWords) {
  const char* saved = std::getenv("BONSAI_CUDA_ACT");
  const std::string keep = saved ? saved : "";
  unsetenv("BONSAI_CUDA_ACT");
  EXPECT_EQ(cuda_options(0, "").gemm_f16, 0);
  EXPECT_EQ(cuda_options(0, "").act_levels, 2);
  const CudaBackend::Options f = cuda_options(0, "f16");
  EXPECT_EQ(f.gemm_f16, CudaBackend::kF16MinRows);
  EXPECT_EQ(f.act_levels, 2);
  EXPECT_FALSE(f.exact);
  EXPECT_EQ(cuda_options(0, "q8").act_levels, 1);
  EXPECT_TRUE(cuda_options(0, "exact").exact);
  setenv("BONSAI_CUDA_ACT", "f16", 1);
  EXPECT_EQ(cuda_options(0, "").gemm_f16, CudaBackend::kF16MinRows);
  EXPECT_EQ(cuda_options(0, "q16").gemm_f16, 0);  // --act wins
  setenv("BONSAI_CUDA_ACT", "f32", 1);
  try {
    cuda_options(0, "");
    ADD_FAILURE() << "BONSAI_CUDA_ACT=f32 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f16"), std::string::npos) << e.what();
  }
  unsetenv("BONSAI_CUDA_ACT");
  try {
    cuda_options(0, "bf16");
    ADD_FAILURE() << "--act bf16 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'bf16'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("f16 or exact"), std::string::npos) << e.what();
  }
  if (saved) setenv("BONSAI_CUDA_ACT", keep.c_str(), 1);
}

// GEMM v4's block shape and K split (host only): the 27b prefill products at 256 tokens and a batched step on 132 SMs,
// and the folded grid's cover of every (tile, 128-group) exactly once, as gemmh_kernel maps its 1-D grid.
TEST(CudaOps, GemmF16Plan) {
  auto plan = [](std::vector<int64_t> Ns, int64_t K, int64_t M, int tile = 0) {
    std::vector<cuda::TernaryDev> t;
    for (int64_t N : Ns) t.push_back({nullptr, nullptr, nullptr, N});
    return cuda::gemmh_plan(t.data(), int(t.size()), K, M, 132, tile);
  };
  // gate+up: 272 tiles of 256 x 128 = 2 waves + 8, those 8 in 8 slices of 5 groups
  const cuda::GemmHPlan gu = plan({17408, 17408}, 5120, 256);
  EXPECT_EQ(gu.cfg, 2);
  EXPECT_EQ(gu.fold.tiles, 272);
  EXPECT_EQ(gu.fold.nfull, 264);
  EXPECT_EQ(gu.fold.kt, 8);
  EXPECT_EQ(gu.fold.tile_floats, 256 * 128);
  // ffn_down: 40 tiles of 256 x 128, every one in 3 slices, summed in the GEMM
  const cuda::GemmHPlan dn = plan({5120}, 17408, 256);
  EXPECT_EQ(dn.cfg, 2);
  EXPECT_EQ(dn.fold.nfull, 0);
  EXPECT_EQ(dn.fold.kt, 3);
  // qkv+z: 128 tiles of 256 x 128, one wave: no split
  const cuda::GemmHPlan qz = plan({10240, 6144}, 5120, 256);
  EXPECT_EQ(qz.cfg, 2);
  EXPECT_EQ(qz.fold.kt, 1);
  EXPECT_EQ(plan({17408, 17408}, 5120, 64).cfg, 1);
  EXPECT_EQ(plan({17408, 17408}, 5120, 32).cfg, 0);
  EXPECT_EQ(plan({17408, 17408}, 5120, 256, 4).cfg, 3);  // forced
  for (const auto& [Ns, K, M] : {std::tuple<std::vector<int64_t>, int64_t, int64_t>{{17408, 17408}, 5120, 256},
                                 {{5120}, 17408, 256}, {{1000, 257}, 5120, 32}, {{200, 40}, 8192, 40}}) {
    const cuda::Gemm3Fold f = plan(Ns, K, M).fold;
    if (f.kt <= 1) continue;
    const int64_t G = K / 128, grid = f.nfull + (f.tiles - f.nfull) * f.kt;
    std::vector<int> cover(size_t(f.tiles * G), 0);
    for (int64_t b = 0; b < grid; ++b) {
      int64_t t = b, kz = 0, ksl = 1;
      if (t >= f.nfull) {
        const int64_t split = (t - f.nfull) / f.kt;
        kz = (t - f.nfull) - split * f.kt, ksl = f.kt, t = f.nfull + split;
      }
      for (int64_t g = G * kz / ksl; g < G * (kz + 1) / ksl; ++g) ++cover[size_t(t * G + g)];
    }
    EXPECT_EQ(std::count(cover.begin(), cover.end(), 1), int64_t(cover.size())) << K << " " << M;
  }
}

// The folded split's plan (host only, no device): the 27b prefill products at 256 tokens on 132 SMs, and the grid's
// (tile, slice) -> 128-group cover of each tile exactly once, as gemm3_kernel maps its 1-D grid.
TEST(CudaOps, GemmV3FoldPlan) {
  auto plan = [](std::vector<int64_t> Ns, int64_t K, int64_t M) {
    std::vector<cuda::TernaryDev> t;
    for (int64_t N : Ns) t.push_back({nullptr, nullptr, nullptr, N});
    return std::make_pair(cuda::gemm3_fold_plan(t.data(), int(t.size()), K, M, 2, 132),
                          cuda::gemm3_ksplit(t.data(), int(t.size()), K, M, 2, 132));
  };
  // gate+up: 544 tiles = 4 waves + 16: those 16 in 8 slices of 5 groups over 128 idle SMs
  auto [gu, gu_ks] = plan({17408, 17408}, 5120, 256);
  EXPECT_EQ(gu.tiles, 544);
  EXPECT_EQ(gu.nfull, 528);
  EXPECT_EQ(gu.kt, 8);
  EXPECT_EQ(gu.tile_floats, 128 * 128);
  EXPECT_EQ(gu_ks, 1);
  // ffn_down / the out projection: 80 tiles, every one in the unfused path's 3 slices (the sum folded in)
  for (const int64_t K : {17408, 6144}) {
    auto [d, d_ks] = plan({5120}, K, 256);
    EXPECT_EQ(d.nfull, 0);
    EXPECT_EQ(d.kt, 3);
    EXPECT_EQ(d_ks, 3);
  }
  // qkv+z: 256 tiles, a last wave of 124 of 132: no split
  EXPECT_EQ(plan({10240, 6144}, 5120, 256).first.kt, 1);
  // a last wave of 68 (> half): every tile split as the unfused rule splits them
  auto [h, h_ks] = plan({25400, 100}, 8192, 20);
  EXPECT_EQ(h.nfull, 0);
  EXPECT_EQ(h.kt, h_ks);
  for (const auto& [Ns, K, M] : {std::tuple<std::vector<int64_t>, int64_t, int64_t>{{17408, 17408}, 5120, 256},
                                 {{17000, 100}, 4096, 20}, {{8300, 129}, 1024, 130}, {{5120}, 17408, 256},
                                 {{17408, 17408}, 5120, 64}}) {
    const cuda::Gemm3Fold f = plan(Ns, K, M).first;
    const int64_t G = K / 128, grid = f.nfull + (f.tiles - f.nfull) * f.kt;
    std::vector<int> cover(size_t(f.tiles * G), 0);
    for (int64_t b = 0; b < grid; ++b) {
      int64_t t = b, kz = 0, ksl = 1;
      if (f.kt > 1 && t >= f.nfull) {
        const int64_t split = (t - f.nfull) / f.kt;
        kz = t - f.nfull - split * f.kt, ksl = f.kt, t = f.nfull + split;
      }
      const int64_t k0 = G * kz / ksl, ng = G * (kz + 1) / ksl - k0;
      EXPECT_GE(ng, f.kt > 1 && t >= f.nfull && f.nfull > 0 ? cuda::kGemm3FoldMinGroups : 1);
      for (int64_t g = k0; g < k0 + ng; ++g) ++cover[size_t(t * G + g)];
    }
    EXPECT_EQ(std::count(cover.begin(), cover.end(), 1), int64_t(cover.size())) << "K " << K << " M " << M;
  }
}

TEST(CudaOps, TernaryLinearMatchesQuantisedAndFp64References) {
  BONSAI_REQUIRE_GPU();
  CudaBackend& be = gpu();
  // be: defaults (q16; M <= 2: the tensor-core matvec v6, above: the GEMM); be2: q16, v3 for every M
  // (no tensor cores); be3 / be4: q8, the bulk-copy matvec (M = 1, K % 1024 == 0) forced to at most 2 / 1
  // rows per warp, else v3 / GEMM; be5: q8 defaults; be6: q16 with the bulk matvec asked for (falls back
  // to v3); be7: q16, the matvec with 2 rows per step (M <= 2 only); be8 / be9: q16, GEMM v2 (wgmma)
  // with 1 / 2 warpgroups per block (the default: v3 on sm_90); be10: be2 with the round-5 matvec grid (fixed row groups per warp);
  // be11: GEMM v1 (mma.sync) forced (the default elsewhere than sm_90); be12: q8 with the default GEMM (v3).
  CudaBackend::Options no_tc;
  no_tc.tensor_cores = false;
  no_tc.graphs = false;
  no_tc.matvec = 3;
  CudaBackend be2(no_tc);
  CudaBackend::Options r2, r1, q8, v4q16, rows2;
  rows2.matvec_rows = 2;
  rows2.matvec = 3;  // v3's 2-row step (v6 is the default matvec since round 8)
  r2.matvec = r1.matvec = 4;
  r2.matvec_bulk_rows = 2;
  r1.matvec_bulk_rows = 1;
  r2.act_levels = r1.act_levels = q8.act_levels = 1;
  v4q16.matvec = 4;
  CudaBackend::Options v2, v2w2;  // q16 with the wgmma GEMM v2 forced, 1 / 2 warpgroups per block (`be`: the
                                  // default, v2 or v1 per product)
  v2.gemm = v2w2.gemm = 2;
  v2.gemm2_wgs = 1;
  v2w2.gemm2_wgs = 2;
  CudaBackend be3(r2), be4(r1), be5(q8), be6(v4q16), be7(rows2), be8(v2), be9(v2w2);
  CudaBackend::Options fixed = no_tc;  // be10: q16, v3 for every M, fixed row groups per warp (round 5 grid)
  fixed.matvec_balance = false;
  CudaBackend be10(fixed);
  CudaBackend::Options v1, v3q8;
  v1.gemm = 1;
  v3q8.gemm = 3;
  v3q8.act_levels = 1;
  CudaBackend be11(v1), be12(v3q8);
  struct Case {
    int64_t M, K;
    std::vector<int64_t> N;
  } cases[] = {{1, 128, {1}},       {1, 384, {37}},        {1, 1152, {300, 129, 7}}, {2, 640, {129}},
               {3, 1152, {65, 31}}, {4, 256, {17}},        {5, 384, {130}},          {17, 1152, {257, 3}},
               {64, 640, {128}},    {70, 384, {200, 75}},  {1, 5120, {1024}},        {64, 5120, {300}},
               // bulk matvec: K % 1024 == 0; several outputs with ragged row groups; a last slice of 16
               // chunks (K = 3072); many row groups per warp (the stage ring wraps); a long K
               {1, 1024, {37, 5, 300}}, {1, 3072, {129, 4}}, {1, 5120, {20003}}, {1, 17408, {70}},
               {1, 2048, {40000}}, {1, 1024, {70001}},  // 4 and 8 rows per warp
               // GEMM split-K (few rows, long K: 4 and 2 K slices, then their ordered sum)
               {32, 8192, {300}}, {70, 4096, {130, 7}},
               // the wave-aware split: 266 blocks of 128 rows just over 2 x 132 resident slots (H200) -> 2
               // K slices (default backend only: the host reference is slow at this size)
               {8, 4096, {34000}},
               // GEMM v2 tiles (32 / 64 / 128 tokens, two halves each): ragged M as the prefill planner sends
               // it, several token tiles, ragged row blocks, paired outputs, split-K with several tiles
               {13, 5120, {300, 7}}, {37, 1152, {129, 65, 3}}, {100, 640, {200}}, {130, 1152, {257, 75}},
               {259, 384, {130}}, {130, 4096, {200, 40}}};
  uint32_t seed = 100;
  for (const Case& c : cases) {
    std::vector<TernaryMatrix*> ws;
    for (int64_t N : c.N) ws.push_back(&random_matrix(N, c.K, seed++, 0.02));
    const auto x = randn(size_t(c.M * c.K), seed++);
    for (CudaBackend* b : {&be, &be2, &be3, &be4, &be5, &be6, &be7, &be8, &be9, &be10, &be11, &be12}) {
      if ((b == &be8 || b == &be9 || b == &be11) && c.M <= 2) continue;  // the matvec either way
      if (b == &be12 && c.M <= 4) continue;
      if (b == &be7 && c.M > 2) continue;
      if ((b == &be3 || b == &be4 || b == &be6) && !cuda::matvec_bulk_supported(c.K, c.M)) continue;
      if (b != &be && c.N[0] >= 34000) continue;
      const int levels = b->options().act_levels;
      for (TernaryMatrix* w : ws) b->prepare_matrix(*w);
      Buffer dx = up(*b, x);
      std::vector<Buffer> ys;
      std::vector<LinearOut> outs;
      for (TernaryMatrix* w : ws) {
        ys.push_back(poisoned(*b, size_t(c.M * w->rows)));
        outs.push_back({w, ys.back().data()});
      }
      b->linear(outs.data(), int(outs.size()), c.K, dx.data(), c.M);
      for (size_t i = 0; i < ws.size(); ++i) {
        const auto got = down(*b, ys[i]);
        const auto exact = quantised_reference(*ws[i], x, c.M, levels, b->row_quantised(c.M, c.K));
        std::vector<float> truth(size_t(c.M * ws[i]->rows));
        ref::ternary_matmul(ws[i]->blocks, ws[i]->rows, c.K, x.data(), c.M, truth.data());
        const std::string what = "M " + std::to_string(c.M) + " K " + std::to_string(c.K) + " N " +
                                 std::to_string(ws[i]->rows) +
                                 (b == &be2   ? " q16 v3"
                                  : b == &be3 ? " q8 bulk R2"
                                  : b == &be4 ? " q8 bulk R1"
                                  : b == &be5 ? " q8 default"
                                  : b == &be6 ? " q16 bulk->v3"
                                  : b == &be7 ? " q16 2 rows"
                                  : b == &be8 ? " q16 gemm v2 w1"
                                  : b == &be9 ? " q16 gemm v2 w2"
                                  : b == &be10 ? " q16 v3 fixed ranges"
                                  : b == &be11 ? " q16 gemm v1"
                                  : b == &be12 ? " q8 gemm v3"
                                              : " q16 default");
        EXPECT_LE(rel_err(got, exact), 1e-4) << what;
        // vs the unquantised fp64 product: |error| <= 1e-4 (q16) / 1% (q8) of sum_e |w_e x_e| per output
        // (int8 noise is ~0.3% of that; a max-relative measure is meaningless for a single output near zero)
        double worst = 0;
        for (int64_t m = 0; m < c.M; ++m)
          for (int64_t n = 0; n < ws[i]->rows; ++n) {
            double mag = 0;
            for (int64_t e = 0; e < c.K; ++e) {
              const int code = ws[i]->code(n, e);
              mag += std::fabs(double(code - 1) * double(fp16_to_f32(ws[i]->group_scale(n, e / 128))) *
                               double(x[size_t(m * c.K + e)]));
            }
            const size_t k = size_t(m * ws[i]->rows + n);
            worst = std::max(worst, std::fabs(double(got[k]) - double(truth[k])) / std::max(mag, 1e-30));
          }
        EXPECT_LE(worst, levels == 2 ? 1e-4 : 1e-2) << what;
      }
      // x itself must be untouched by the quantisation.
      EXPECT_EQ(down(*b, dx), x);
    }
  }
}

TEST(CudaOps, DenseLinearSingleAndPaired) {
  BONSAI_REQUIRE_GPU();
  CudaBackend& be = gpu();
  const int64_t K = 640, N0 = 48, N1 = 37;
  for (int64_t M : {1, 3, 16, 37, 256}) {  // M >= 16: dense_tile_kernel (8 rows x 8 tokens; 85 rows: a partial tile)
    const auto w0 = randn(size_t(N0 * K), 1, 0.05f), w1 = randn(size_t(N1 * K), 2, 0.05f), x = randn(size_t(M * K), 3);
    std::vector<float> y0(size_t(M * N0)), y1(size_t(M * N1));
    ref::dense_matmul_f32(w0.data(), N0, K, x.data(), M, y0.data());
    ref::dense_matmul_f32(w1.data(), N1, K, x.data(), M, y1.data());
    Buffer dw0 = up(be, w0), dw1 = up(be, w1), dx = up(be, x);
    Buffer o0 = poisoned(be, y0.size()), o1 = poisoned(be, y1.size());
    be.dense_linear(dw0.data(), N0, K, dx.data(), M, o0.data());
    be.dense_linear(dw1.data(), N1, K, dx.data(), M, o1.data());  // fused with the first
    const auto g0 = down(be, o0), g1 = down(be, o1);
    EXPECT_LE(rel_err(g0, y0), 1e-5);
    EXPECT_LE(rel_err(g1, y1), 1e-5);
    // Round 11: the tile kernel's x loads hoisted ahead of the FMAs (the default) against the guarded loads
    // (BONSAI_CUDA_DENSE_HOIST=0): the same FMAs in the same order, EQUAL outputs.
    setenv("BONSAI_CUDA_DENSE_HOIST", "0", 1);
    Buffer p0 = poisoned(be, y0.size()), p1 = poisoned(be, y1.size());
    be.dense_linear(dw0.data(), N0, K, dx.data(), M, p0.data());
    be.dense_linear(dw1.data(), N1, K, dx.data(), M, p1.data());
    EXPECT_EQ(down(be, p0), g0) << "M " << M;
    EXPECT_EQ(down(be, p1), g1) << "M " << M;
    unsetenv("BONSAI_CUDA_DENSE_HOIST");
  }
}

// v with each value truncated to bf16 (any bf16 value will do): CudaBackend::upload_constant(..., true) then keeps such
// weights as bf16, as prepare() does with the packs' dense a / b projections.
std::vector<float> bf16_exact(std::vector<float> v) {
  for (float& f : v) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u &= 0xffff0000u;
    std::memcpy(&f, &u, 4);
  }
  return v;
}

// Round 29: the prefill a / b pair of bf16 weights on the tensor cores (dense_mma_kernel: x as three bf16 pieces) against
// the fp64 reference and the fp32 tile kernel (BONSAI_CUDA_DENSE_MMA=0). M 33 / 100 / 300 (ragged 16-token tiles), K 640
// / 5,120 (8 warps' K chunks: 2.5 and 20 each), N 48 + 48 (the 27b's: 3 blocks of 32 rows, one across the pair's
// seam), 3 + 2 (one partial block) and 128 alone (4 blocks).
TEST(CudaOps, DenseMmaBf16MatchesTheTileKernel) {
  BONSAI_REQUIRE_GPU();
  CudaBackend& be = gpu();
  struct Shape {
    int64_t K, N0, N1;
  };
  for (const Shape sh : {Shape{640, 48, 48}, Shape{5120, 48, 48}, Shape{640, 3, 2}, Shape{640, 128, 0}}) {
    const int64_t K = sh.K, N0 = sh.N0, N1 = sh.N1;
    // host weights live as long as the backend's constants keyed by their address: static storage per shape
    static std::deque<std::vector<float>> keep;  // a deque: references to its elements survive push_back
    keep.push_back(bf16_exact(randn(size_t(N0 * K), uint32_t(K + N0), 0.05f)));
    const std::vector<float>& w0 = keep.back();
    keep.push_back(bf16_exact(randn(size_t(std::max<int64_t>(N1, 1) * K), uint32_t(K + N1 + 7), 0.05f)));
    const std::vector<float>& w1 = keep.back();
    be.upload_constant(w0.data(), w0.size() * 4, true);
    be.upload_constant(w1.data(), w1.size() * 4, true);
    for (int64_t M : {33, 100, 300}) {
      const auto x = randn(size_t(M * K), uint32_t(M + K), 2.f);
      std::vector<float> y0(size_t(M * N0)), y1(size_t(M * std::max<int64_t>(N1, 1)));
      ref::dense_matmul_f32(w0.data(), N0, K, x.data(), M, y0.data());
      if (N1) ref::dense_matmul_f32(w1.data(), N1, K, x.data(), M, y1.data());
      Buffer dx = up(be, x);
      auto run = [&](bool mma) {
        if (!mma) setenv("BONSAI_CUDA_DENSE_MMA", "0", 1);
        Buffer o0 = poisoned(be, y0.size()), o1 = poisoned(be, y1.size());
        be.dense_linear(w0.data(), N0, K, dx.data(), M, o0.data());
        if (N1) be.dense_linear(w1.data(), N1, K, dx.data(), M, o1.data());  // paired with the first
        auto r = std::make_pair(down(be, o0), N1 ? down(be, o1) : std::vector<float>{});
        unsetenv("BONSAI_CUDA_DENSE_MMA");
        return r;
      };
      const auto [g0, g1] = run(true);
      const auto [t0, t1] = run(false);
      const std::string at = "K " + std::to_string(K) + " N " + std::to_string(N0) + "+" + std::to_string(N1) + " M " +
                             std::to_string(M);
      // fp32-level: dropping x's lo piece would be ~2e-6 here, its mid piece ~1e-3
      EXPECT_LE(rel_err(g0, y0), 1e-6) << at;
      EXPECT_LE(rel_err(g0, t0), 1e-6) << at;
      EXPECT_LE(rel_err(t0, y0), 1e-6) << at;
      if (N1) {
        EXPECT_LE(rel_err(g1, y1), 1e-6) << at;
        EXPECT_LE(rel_err(g1, t1), 1e-6) << at;
      }
      EXPECT_EQ(run(true).first, g0) << at << ": run to run";
    }
  }
}

TEST(CudaOps, Norms) {
  BONSAI_REQUIRE_GPU();
  CudaBackend& be = gpu();
  const int64_t rows = 7, n = 1000;
  const auto x = randn(size_t(rows * n), 1, 2.f), d = randn(size_t(rows * n), 2), gain = uniform(size_t(n), 3, 0.5f, 1.5f);
  Buffer dg = up(be, gain);
  {
    std::vector<float> want(x.size());
    ref::rmsnorm(x.data(), rows, n, gain.data(), 1e-6f, want.data());
    Buffer dx = up(be, x), o = poisoned(be, x.size());
    be.rmsnorm(dx.data(), rows, n, dg.data(), 1e-6f, o.data());
    EXPECT_LE(rel_err(down(be, o), want), 1e-5);
    be.rmsnorm(dx.data(), rows, n, nullptr, 1e-6f, dx.data());  // in place, no gain
    ref::rmsnorm(x.data(), rows, n, nullptr, 1e-6f, want.data());
    EXPECT_LE(rel_err(down(be, dx), want), 1e-5);
  }
  {
    auto h = x;
    std::vector<float> want(x.size());
    ref::add_rmsnorm(h.data(), d.data(), rows, n, gain.data(), 1e-6f, want.data());
    Buffer dh = up(be, x), dd = up(be, d), o = poisoned(be, x.size());
    be.add_rmsnorm(dh.data(), dd.data(), rows, n, dg.data(), 1e-6f, o.data());
    EXPECT_LE(rel_err(down(be, o), want), 1e-5);
    EXPECT_LE(rel_err(down(be, dh), h), 1e-6);
  }
  {
    const int64_t hr = 21, hd = 128;
    auto want = randn(size_t(hr * hd), 4, 3.f);
    Buffer dx = up(be, want);
    ref::l2norm_heads(want.data(), hr, hd, 1e-6f);
    be.l2norm_heads(dx.data(), hr, hd, 1e-6f);
    EXPECT_LE(rel_err(down(be, dx), want), 1e-5);
  }
  {
    const int64_t hr = 13, Dv = 128;
    const auto o = randn(size_t(hr * Dv), 5), z = randn(size_t(hr * Dv), 6), g = uniform(size_t(Dv), 7, 0.5f, 1.5f);
    std::vector<float> want(o.size());
    ref::gated_rmsnorm(o.data(), z.data(), g.data(), hr, Dv, 1e-6f, want.data());
    Buffer dO = up(be, o), dz = up(be, z), dgn = up(be, g), out = poisoned(be, o.size());
    be.gated_rmsnorm(dO.data(), dz.data(), dgn.data(), hr, Dv, 1e-6f, out.data());
    EXPECT_LE(rel_err(down(be, out), want), 1e-5);
  }
}

TEST(CudaOps, RopeNeoxAtLargePositions) {
  BONSAI_REQUIRE_GPU();
  CudaBackend& be = gpu();
  const int64_t M = 3, H = 5, D = 64, rot = 16;
  for (int64_t p0 : {0, 7, 200000}) {
    auto want = randn(size_t(M * H * D), uint32_t(p0 + 1));
    Buffer dx = up(be, want);
    for (int64_t m = 0; m < M; ++m) ref::rope_neox(want.data() + m * H * D, H, D, rot, p0 + m, 1e7f);
    be.rope_neox(dx.data(), M, H, D, rot, p0, 1e7f);
    EXPECT_LE(rel_err(down(be, dx), want), 1e-5) << "p0 " << p0;
  }
}

// The launch-shape policies are host code: these run without a GPU (in CI too).
// Decode attention's head split: one wave of blocks at most, G divided evenly, nothing split once splits fill the SMs.
TEST(CudaPolicy, AttentionHeadSplitKeepsOneWave) {
  // the 27B shape on an H200 (132 SMs): Hkv 4, G 6
  EXPECT_EQ(cuda::attention_head_split(1, 4, 6, 132), 6);   // depth 0: 24 blocks instead of 4
  EXPECT_EQ(cuda::attention_head_split(5, 4, 6, 132), 6);   // 120 blocks
  EXPECT_EQ(cuda::attention_head_split(6, 4, 6, 132), 3);   // 6 x 4 x 6 = 144 > 132: the next divisor
  EXPECT_EQ(cuda::attention_head_split(11, 4, 6, 132), 3);  // 132 exactly
  EXPECT_EQ(cuda::attention_head_split(12, 4, 6, 132), 2);
  EXPECT_EQ(cuda::attention_head_split(17, 4, 6, 132), 1);  // 17 x 4 x 2 = 136
  EXPECT_EQ(cuda::attention_head_split(32, 4, 6, 132), 1);  // long contexts: splits fill the SMs
  EXPECT_EQ(cuda::attention_head_split(1, 4, 5, 132), 5);   // G prime: all or nothing
  EXPECT_EQ(cuda::attention_head_split(7, 4, 5, 132), 1);   // 7 x 4 x 5 = 140
  EXPECT_EQ(cuda::attention_head_split(1, 8, 1, 132), 1);   // MHA: nothing to split
  EXPECT_EQ(cuda::attention_head_split(1, 200, 6, 132), 1); // more KV heads than SMs
}

// Round 14's long-context rule (Options::attn_long): from 16 splits, at most two query heads per block.
TEST(CudaPolicy, AttentionLongContextsHoldTwoHeadsABlock) {
  EXPECT_EQ(cuda::attention_long_head_split(32, 6, 1), 3);   // the 27B at 8k: 6 heads -> 3 blocks of 2
  EXPECT_EQ(cuda::attention_long_head_split(16, 6, 1), 3);   // from kAttnLongSplits on
  EXPECT_EQ(cuda::attention_long_head_split(15, 6, 1), 1);   // shorter: the head split as it was
  EXPECT_EQ(cuda::attention_long_head_split(11, 6, 3), 3);
  EXPECT_EQ(cuda::attention_long_head_split(17, 5, 1), 5);   // G prime: one head a block
  EXPECT_EQ(cuda::attention_long_head_split(20, 8, 1), 4);   // G 8 -> 4 blocks of 2
  EXPECT_EQ(cuda::attention_long_head_split(20, 8, 8), 8);   // already split further: kept
  EXPECT_EQ(cuda::attention_long_head_split(32, 2, 1), 1);   // two heads already
  EXPECT_EQ(cuda::attention_long_head_split(32, 1, 1), 1);   // MHA
  for (int64_t G = 1; G <= 8; ++G) {  // every result divides G and leaves at most two heads a block
    const int h = cuda::attention_long_head_split(32, G, 1);
    EXPECT_EQ(G % h, 0) << G;
    EXPECT_LE(G / h, 2) << G;
  }
}

// Per-row argmax chunks: >= ~4 elements per thread, about two waves of blocks, 1..64 per row.
TEST(CudaPolicy, ArgmaxRowChunks) {
  EXPECT_EQ(cuda::argmax_rows_chunks(1, 248320, 132), 61);  // batch-1 logits of the 27B vocabulary
  EXPECT_EQ(cuda::argmax_rows_chunks(5, 100003, 132), 25);
  EXPECT_EQ(cuda::argmax_rows_chunks(40, 30011, 132), 6);   // 264 / 40 blocks per row
  EXPECT_EQ(cuda::argmax_rows_chunks(32, 248320, 132), 8);  // B = 32
  EXPECT_EQ(cuda::argmax_rows_chunks(3, 1000, 132), 1);     // short rows: one block
  EXPECT_EQ(cuda::argmax_rows_chunks(1000, 248320, 132), 1);
  EXPECT_EQ(cuda::argmax_rows_chunks(1, int64_t(1) << 30, 132), int(cuda::kArgmaxRowMaxChunks));
}

TEST(CudaOps, AttentionDecodeAndPrefill) {
  BONSAI_REQUIRE_GPU();
  // decode: two key positions per warp step (Options::attn_pairs) and one (round 6); query heads spread over
  // more blocks at short contexts (Options::attn_hsplit 0: G / hsplit heads per block) and not (1)
  // hsplit 2: Options::attn_long (from 16 splits: two query heads per block, the 2-head kernel instance)
  for (int pairs : {2, 1})
  for (int hsplit : {0, 1, 2}) {
    if (hsplit == 2 && pairs == 1) continue;  // the 2-head instance is a two-position one
    CudaBackend::Options opt;
    opt.attn_pairs = pairs;
    opt.attn_hsplit = hsplit == 2 ? 0 : hsplit;
    opt.attn_long = hsplit == 2;
    CudaBackend be(opt);
    struct Case {
      int64_t M, p0, Hq, Hkv, D;
    } cases[] = {{1, 0, 12, 2, 256},  {1, 1, 12, 2, 256},  {1, 37, 24, 4, 256}, {1, 300, 12, 2, 256},
                 {5, 0, 12, 2, 256},  {5, 40, 6, 6, 64},   {70, 3, 12, 2, 256}, {1, 5000, 24, 4, 256},
                 {33, 600, 8, 1, 96},
                 // decode with 24 splits (between the prefill cap of 16 and the decode cap of 32); a prefill
                 // chunk at a long context (16 splits, the prefill cap)
                 {1, 1500, 24, 4, 256}, {40, 5000, 12, 2, 128},
                 // head splits of 3 (11 splits x 4 KV heads x 3 <= 132 SMs) and 2 (15 splits); G = 5 (split 5)
                 {1, 700, 24, 4, 256}, {1, 900, 24, 4, 256}, {1, 37, 20, 4, 128},
                 // long contexts (Options::attn_long: 32 / 17 splits; G 6 -> 2 heads a block, G 5 -> 1, G 1)
                 {1, 8191, 24, 4, 256}, {1, 1030, 20, 4, 128}, {1, 2100, 4, 4, 64}};
    for (const Case& c : cases) {
      const int64_t T = c.p0 + c.M;
      const auto q = randn(size_t(c.M * c.Hq * c.D), 1), k = randn(size_t(T * c.Hkv * c.D), 2),
                 v = randn(size_t(T * c.Hkv * c.D), 3);
      const float scale = float(1.0 / std::sqrt(double(c.D)));
      std::vector<float> want(q.size());
      if (c.M == 1) ref::attention_decode(q.data(), k.data(), v.data(), T, c.Hq, c.Hkv, c.D, scale, want.data());
      else ref::attention_prefill(q.data(), k.data(), v.data(), c.M, c.p0, c.Hq, c.Hkv, c.D, scale, want.data());
      Buffer dq = up(be, q), dk = up(be, k), dv = up(be, v), o = poisoned(be, q.size());
      be.attention(dq.data(), dk.data(), dv.data(), c.M, c.p0, c.Hq, c.Hkv, c.D, scale, o.data());
      EXPECT_LE(rel_err(down(be, o), want), 2e-5)
          << "M " << c.M << " p0 " << c.p0 << " Hq " << c.Hq << " pairs " << pairs << " hsplit " << hsplit;
      // twice: the split counters must have been left at zero
      be.attention(dq.data(), dk.data(), dv.data(), c.M, c.p0, c.Hq, c.Hkv, c.D, scale, o.data());
      EXPECT_LE(rel_err(down(be, o), want), 2e-5) << "second call, pairs " << pairs << " hsplit " << hsplit;
    }
  }
}

// Round 8b: the prefill tile kernel (attn_prefill_kernel, Options::attn = 2 / default at M >= 16; 3: 4 rows per
// thread, since round 12 the tensor-core kernel unless attn_prefill_mma = 0: AttentionPrefillMma) and the
// flash-decoding kernel it replaces (attn = 1) on prefill chunks with tails: rows 2..256 (partial
// 32-row tiles), contexts that end inside a 32-position tile, D 64 / 96 / 128 / 256, GQA 1 / 4 / 6 / 8.
TEST(CudaOps, AttentionPrefillTiles) {
  BONSAI_REQUIRE_GPU();
  struct Case {
    int64_t M, p0, Hq, Hkv, D;
  } cases[] = {{2, 0, 24, 4, 256},   {5, 3, 12, 2, 256},  {31, 0, 24, 4, 256},  {32, 32, 24, 4, 256},
               {33, 40, 6, 6, 64},   {70, 3, 12, 2, 256}, {33, 600, 8, 1, 96}, {40, 500, 12, 2, 128},
               {256, 0, 24, 4, 256}, {256, 1792, 24, 4, 256}};
  // The inputs and the fp32 reference of each case, computed once for the three kernels (the reference is most of the
  // test's time on the device machine).
  struct Io {
    std::vector<float> q, k, v, want;
    float scale;
  };
  std::vector<Io> io;
  uint32_t seed = 40;
  for (const Case& c : cases) {
    const int64_t T = c.p0 + c.M;
    Io& e = io.emplace_back();
    e.q = randn(size_t(c.M * c.Hq * c.D), seed++);
    e.k = randn(size_t(T * c.Hkv * c.D), seed++);
    e.v = randn(size_t(T * c.Hkv * c.D), seed++);
    e.scale = float(1.0 / std::sqrt(double(c.D)));
    e.want.resize(e.q.size());
    ref::attention_prefill(e.q.data(), e.k.data(), e.v.data(), c.M, c.p0, c.Hq, c.Hkv, c.D, e.scale, e.want.data());
  }
  for (int mode : {2, 3, 1}) {
    CudaBackend::Options o;
    o.attn = mode;
    CudaBackend be(o);
    for (size_t ci = 0; ci < std::size(cases); ++ci) {
      const Case& c = cases[ci];
      const auto& [q, k, v, want, scale] = io[ci];
      Buffer dq = up(be, q), dk = up(be, k), dv = up(be, v), out = poisoned(be, q.size());
      be.attention(dq.data(), dk.data(), dv.data(), c.M, c.p0, c.Hq, c.Hkv, c.D, scale, out.data());
      const auto got = down(be, out);
      const std::string what = "M " + std::to_string(c.M) + " p0 " + std::to_string(c.p0) + " Hq " +
                               std::to_string(c.Hq) + " Hkv " + std::to_string(c.Hkv) + " D " + std::to_string(c.D) +
                               " attn " + std::to_string(mode);
      EXPECT_LE(rel_err(got, want), 2e-5) << what;
      // the first and the last query row alone (row 0 sees one tile, the last row the partial last tile)
      const size_t row = size_t(c.Hq * c.D);
      EXPECT_LE(rel_err({got.begin(), got.begin() + row}, {want.begin(), want.begin() + row}), 2e-5) << what << " row 0";
      EXPECT_LE(rel_err({got.end() - row, got.end()}, {want.end() - row, want.end()}), 2e-5) << what << " last row";
    }
  }
}

// Round 12: the tensor-core prefill kernel (attn_prefill_mma.cu; Options::attn_prefill_mma, here with attn = 3 so it
// runs at every M > 1) against the fp32 reference and the fp32 tile kernel it replaces (attn_prefill_mma = 0): ragged
// chunks (8-row blocks with tails), KV prefixes (p0 > 0, contexts ending inside a 32-position tile), D 32 .. 256, G 1
// / 2 / 5 / 6 / 8 (odd G: a half-empty head pair; G 8: the 512-thread instance). Bounds, max |x - ref| / max |ref|:
// hi + lo operands 2e-5 (fp32-level, as the fp32 kernels), f16 operands 2e-3. Two runs bit-identical. p0 5,000: most
// probabilities ~1e-4, where f16's subnormal floor showed before P was scaled (2.1e-5 in AttentionDecodeAndPrefill).
TEST(CudaOps, AttentionPrefillMma) {
  BONSAI_REQUIRE_GPU();
  struct Case {
    int64_t M, p0, Hq, Hkv, D;
  } cases[] = {{2, 0, 24, 4, 256},   {5, 3, 12, 2, 256},    {7, 0, 6, 6, 64},      {9, 30, 24, 4, 256},
               {31, 0, 24, 4, 256},  {33, 40, 6, 6, 64},    {70, 3, 12, 2, 256},   {33, 600, 8, 1, 96},
               {40, 500, 12, 2, 128}, {17, 100, 20, 4, 128}, {50, 77, 4, 2, 32},   {200, 1000, 24, 4, 256},
               {40, 5000, 12, 2, 128}, {256, 1792, 24, 4, 256}};
  const int modes[3] = {1, 2, 0};              // attn_prefill_mma: hi + lo, f16, off (the fp32 kernel)
  const double bound[3] = {2e-5, 2e-3, 2e-5};  // per mode, max |x - ref| / max |ref|
  std::vector<std::unique_ptr<CudaBackend>> bes, conv;  // conv: round 12's per-block conversion (attn_planes off)
  for (int mode : modes) {
    CudaBackend::Options o;
    o.attn = 3;
    o.attn_prefill_mma = mode;
    bes.push_back(std::make_unique<CudaBackend>(o));
    o.attn_planes = false;
    conv.push_back(std::make_unique<CudaBackend>(o));
  }
  double worst[3] = {}, worst_abs[3] = {};
  uint32_t seed = 90;
  for (const Case& c : cases) {
    const int64_t T = c.p0 + c.M;
    const auto q = randn(size_t(c.M * c.Hq * c.D), seed++), k = randn(size_t(T * c.Hkv * c.D), seed++),
               v = randn(size_t(T * c.Hkv * c.D), seed++);
    const float scale = float(1.0 / std::sqrt(double(c.D)));
    std::vector<float> want(q.size());
    ref::attention_prefill(q.data(), k.data(), v.data(), c.M, c.p0, c.Hq, c.Hkv, c.D, scale, want.data());
    for (int i = 0; i < 3; ++i) {
      CudaBackend& be = *bes[size_t(i)];
      Buffer dq = up(be, q), dk = up(be, k), dv = up(be, v), out = poisoned(be, q.size());
      be.attention(dq.data(), dk.data(), dv.data(), c.M, c.p0, c.Hq, c.Hkv, c.D, scale, out.data());
      const auto got = down(be, out);
      const std::string what = "M " + std::to_string(c.M) + " p0 " + std::to_string(c.p0) + " Hq " +
                               std::to_string(c.Hq) + " Hkv " + std::to_string(c.Hkv) + " D " + std::to_string(c.D) +
                               " attn_prefill_mma " + std::to_string(modes[i]);
      const double e = rel_err(got, want);
      EXPECT_LE(e, bound[i]) << what;
      const size_t row = size_t(c.Hq * c.D);  // the first and the last query row alone
      EXPECT_LE(rel_err({got.begin(), got.begin() + row}, {want.begin(), want.begin() + row}), bound[i]) << what;
      EXPECT_LE(rel_err({got.end() - row, got.end()}, {want.end() - row, want.end()}), bound[i]) << what;
      worst[i] = std::max(worst[i], e);
      for (size_t j = 0; j < got.size(); ++j) worst_abs[i] = std::max(worst_abs[i], double(std::fabs(got[j] - want[j])));
      be.attention(dq.data(), dk.data(), dv.data(), c.M, c.p0, c.Hq, c.Hkv, c.D, scale, out.data());
      EXPECT_EQ(down(be, out), got) << what << ": second run";
      // Round 18: the f16 planes written once per launch are the per-block conversion's operands: EQUAL outputs.
      CudaBackend& cb = *conv[size_t(i)];
      Buffer cq = up(cb, q), ck = up(cb, k), cv = up(cb, v), cout = poisoned(cb, q.size());
      cb.attention(cq.data(), ck.data(), cv.data(), c.M, c.p0, c.Hq, c.Hkv, c.D, scale, cout.data());
      EXPECT_EQ(down(cb, cout), got) << what << ": attn_planes off";
    }
  }
  for (int i = 0; i < 3; ++i)
    std::printf("attn_prefill_mma %d: max rel err %.3g, max |x - ref| %.3g over %zu cases\n", modes[i], worst[i],
                worst_abs[i], std::size(cases));
}

TEST(CudaOps, ElementwiseAndCopies) {
  BONSAI_REQUIRE_GPU();
  CudaBackend& be = gpu();
  const int64_t n = 12345;
  const auto a = randn(size_t(n), 1), b = randn(size_t(n), 2);
  {
    auto want = a;
    ref::sigmoid_gate_mul(want.data(), b.data(), n);
    Buffer da = up(be, a), db = up(be, b);
    be.sigmoid_gate_mul(da.data(), db.data(), n);
    EXPECT_LE(rel_err(down(be, da), want), 1e-6);
  }
  {
    std::vector<float> want(static_cast<size_t>(n));
    ref::silu_mul(a.data(), b.data(), n, want.data());
    Buffer da = up(be, a), db = up(be, b), o = poisoned(be, size_t(n));
    be.silu_mul(da.data(), db.data(), n, o.data());
    EXPECT_LE(rel_err(down(be, o), want), 1e-6);
    be.scale(o.data(), size_t(n), 0.25f);
    for (auto& w : want) w *= 0.25f;
    EXPECT_LE(rel_err(down(be, o), want), 1e-6);
  }
  // element copy (cols 33) and the 16-byte copy4_kernel (cols, strides multiples of 4; round 8b)
  for (const auto& [rows, cols, lds, ldd] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{7, 33, 50, 40},
                                             {300, 36, 52, 40}}) {
    const auto src = randn(size_t(rows * lds), 3);
    Buffer ds = up(be, src), dd = up(be, std::vector<float>(size_t(rows * ldd), -1.f));
    be.copy_rows(dd.data(), ldd, ds.data(), lds, rows, cols);
    const auto got = down(be, dd);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < ldd; ++c)
        EXPECT_EQ(got[size_t(r * ldd + c)], c < cols ? src[size_t(r * lds + c)] : -1.f) << rows << " " << cols;
  }
  {
    const int64_t rows = 3, K = 257;
    std::vector<int32_t> perm(static_cast<size_t>(K));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(1));
    const auto x = randn(size_t(rows * K), 4);
    Buffer dx = up(be, x), dp = up_bytes(be, perm), o = poisoned(be, x.size());
    be.permute_cols(dx.data(), rows, K, reinterpret_cast<const int32_t*>(dp.data()), o.data());
    const auto got = down(be, o);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < K; ++i) EXPECT_EQ(got[size_t(r * K + i)], x[size_t(r * K + perm[size_t(i)])]);
  }
}

TEST(CudaOps, GdnConvAndGates) {
  BONSAI_REQUIRE_GPU();
  CudaBackend& be = gpu();
  // T > 1: conv_seq_kernel (8 token slices; T < 8 leaves some empty); T >= 32 with C % 4 == 0: conv_seq4_kernel (4
  // channels a lane, 32-token slices: 40 and 300 leave ragged slices and a second block row, 300 channels a partial
  // 128-channel block), which must equal conv_seq_kernel bit for bit (BONSAI_CUDA_CONV4=0); C 302 and Kc 2 / 8 too.
  const std::pair<int64_t, int64_t> shapes[] = {{300, 4}, {302, 4}, {256, 2}, {128, 8}};  // C, Kc
  for (const auto& [C, Kc] : shapes) {
    const auto taps = randn(size_t(C * Kc), uint32_t(C + Kc), 0.5f);
    Buffer dt = up(be, taps);
    for (int64_t T : {1, 2, 5, 8, 9, 33, 40, 256, 300}) {
      const auto x = randn(size_t(T * C), uint32_t(T + 10)), st0 = randn(size_t((Kc - 1) * C), uint32_t(T + 20));
      auto st = st0;
      std::vector<float> want(x.size());
      ref::gdn_conv(x.data(), st.data(), taps.data(), T, C, Kc, want.data());
      Buffer dx = up(be, x), ds = up(be, st0), o = poisoned(be, x.size());
      be.gdn_conv(dx.data(), ds.data(), dt.data(), T, C, Kc, o.data());
      const auto got = down(be, o);
      EXPECT_LE(rel_err(got, want), 1e-5) << "C " << C << " Kc " << Kc << " T " << T;
      EXPECT_EQ(down(be, ds), st) << "C " << C << " Kc " << Kc << " T " << T;
      setenv("BONSAI_CUDA_CONV4", "0", 1);
      Buffer ds1 = up(be, st0), o1 = poisoned(be, x.size());
      be.gdn_conv(dx.data(), ds1.data(), dt.data(), T, C, Kc, o1.data());
      unsetenv("BONSAI_CUDA_CONV4");
      EXPECT_EQ(down(be, o1), got) << "C " << C << " Kc " << Kc << " T " << T;
      EXPECT_EQ(down(be, ds1), st) << "C " << C << " Kc " << Kc << " T " << T;
    }
  }
  const int64_t T = 3, Nv = 48;
  const auto a = randn(size_t(T * Nv), 1, 3.f), b = randn(size_t(T * Nv), 2, 3.f), A = uniform(size_t(Nv), 3, -8.f, -0.1f),
             dtb = randn(size_t(Nv), 4, 2.f);
  std::vector<float> g(a.size()), beta(a.size());
  ref::gdn_gates(a.data(), b.data(), A.data(), dtb.data(), T, Nv, g.data(), beta.data());
  Buffer da = up(be, a), db = up(be, b), dA = up(be, A), dd = up(be, dtb), og = poisoned(be, a.size()),
         ob = poisoned(be, a.size());
  be.gdn_gates(da.data(), db.data(), dA.data(), dd.data(), T, Nv, og.data(), ob.data());
  EXPECT_LE(rel_err(down(be, og), g), 1e-5);
  EXPECT_LE(rel_err(down(be, ob), beta), 1e-6);
}

// A decode token's dense a/b pair and GDN conv share one launch (conv_dense_kernel) when fusion is on: the same
// values as the two launches (bit for bit: the same per-block arithmetic) and as the reference, one launch fewer.
TEST(CudaOps, ConvAndDenseShareALaunchAtDecode) {
  BONSAI_REQUIRE_GPU();
  const int64_t C = 700, Kc = 4, K = 640, Nv = 48;
  const auto taps = randn(size_t(C * Kc), 31, 0.5f), x = randn(size_t(C), 32), st0 = randn(size_t((Kc - 1) * C), 33),
             wa = randn(size_t(Nv * K), 34, 0.05f), wb = randn(size_t(Nv * K), 35, 0.05f), xn = randn(size_t(K), 36);
  auto st = st0;
  std::vector<float> want(static_cast<size_t>(C)), ya(static_cast<size_t>(Nv)), yb(static_cast<size_t>(Nv));
  ref::gdn_conv(x.data(), st.data(), taps.data(), 1, C, Kc, want.data());
  ref::dense_matmul_f32(wa.data(), Nv, K, xn.data(), 1, ya.data());
  ref::dense_matmul_f32(wb.data(), Nv, K, xn.data(), 1, yb.data());
  std::vector<std::vector<float>> got[2];
  uint64_t launches[2];
  for (int fused : {1, 0}) {
    CudaBackend::Options o;
    o.conv_dense = fused;
    o.graphs = false;
    CudaBackend be(o);
    Buffer dt = up(be, taps), dx = up(be, x), ds = up(be, st0), dwa = up(be, wa), dwb = up(be, wb), dxn = up(be, xn),
           out = poisoned(be, size_t(C)), oa = poisoned(be, size_t(Nv)), ob = poisoned(be, size_t(Nv));
    const uint64_t k0 = be.stats().kernels;
    be.dense_linear(dwa.data(), Nv, K, dxn.data(), 1, oa.data());
    be.dense_linear(dwb.data(), Nv, K, dxn.data(), 1, ob.data());
    be.gdn_conv(dx.data(), ds.data(), dt.data(), 1, C, Kc, out.data());
    got[fused] = {down(be, out), down(be, ds), down(be, oa), down(be, ob)};
    launches[fused] = be.stats().kernels - k0;
    const char* what = fused ? "one launch" : "two launches";
    EXPECT_LE(rel_err(got[fused][0], want), 1e-5) << what;
    EXPECT_EQ(got[fused][1], st) << what;
    EXPECT_LE(rel_err(got[fused][2], ya), 1e-5) << what;
    EXPECT_LE(rel_err(got[fused][3], yb), 1e-5) << what;
  }
  EXPECT_EQ(got[1], got[0]);
  EXPECT_EQ(launches[1] + 1, launches[0]);
}

// Round 22: a batched step's conv rows and its a / b pair share one launch (conv_dense_rows_kernel): the conv outputs
// and states and the dense outputs bit for bit those of the two launches (the same blocks' arithmetic), against the
// reference, one launch fewer; M 5 and 32 rows (one and four token tiles), each with its own conv state.
TEST(CudaOps, ConvRowsAndDenseShareALaunch) {
  BONSAI_REQUIRE_GPU();
  const int64_t C = 700, Kc = 4, K = 512, Nv = 48;
  for (int64_t M : {5, 32}) {
    const auto taps = randn(size_t(C * Kc), 41, 0.5f), x = randn(size_t(M * C), 42),
               st0 = randn(size_t(M * (Kc - 1) * C), 43), wa = randn(size_t(Nv * K), 44, 0.05f),
               wb = randn(size_t(Nv * K), 45, 0.05f), xn = randn(size_t(M * K), 46);
    auto st = st0;
    std::vector<float> want(size_t(M * C)), ya(size_t(M * Nv)), yb(size_t(M * Nv));
    for (int64_t m = 0; m < M; ++m)
      ref::gdn_conv(x.data() + m * C, st.data() + m * (Kc - 1) * C, taps.data(), 1, C, Kc, want.data() + m * C);
    ref::dense_matmul_f32(wa.data(), Nv, K, xn.data(), M, ya.data());
    ref::dense_matmul_f32(wb.data(), Nv, K, xn.data(), M, yb.data());
    std::vector<std::vector<float>> got[2];
    uint64_t launches[2];
    for (int fused : {1, 0}) {
      CudaBackend::Options o;
      o.conv_dense = fused;
      o.graphs = false;
      CudaBackend be(o);
      Buffer dt = up(be, taps), dx = up(be, x), ds = up(be, st0), dwa = up(be, wa), dwb = up(be, wb), dxn = up(be, xn),
             out = poisoned(be, size_t(M * C)), oa = poisoned(be, size_t(M * Nv)), ob = poisoned(be, size_t(M * Nv));
      std::vector<float*> states(static_cast<size_t>(M));
      for (int64_t m = 0; m < M; ++m) states[size_t(m)] = ds.data() + m * (Kc - 1) * C;
      const uint64_t k0 = be.stats().kernels;
      be.dense_linear(dwa.data(), Nv, K, dxn.data(), M, oa.data());
      be.dense_linear(dwb.data(), Nv, K, dxn.data(), M, ob.data());
      be.gdn_conv_rows(dx.data(), states.data(), dt.data(), M, C, Kc, out.data());
      got[fused] = {down(be, out), down(be, ds), down(be, oa), down(be, ob)};
      launches[fused] = be.stats().kernels - k0;
      const std::string what = "M " + std::to_string(M) + (fused ? " one launch" : " two launches");
      EXPECT_LE(rel_err(got[fused][0], want), 1e-5) << what;
      EXPECT_EQ(got[fused][1], st) << what;
      EXPECT_LE(rel_err(got[fused][2], ya), 1e-5) << what;
      EXPECT_LE(rel_err(got[fused][3], yb), 1e-5) << what;
    }
    EXPECT_EQ(got[1], got[0]) << "M " << M;
    EXPECT_EQ(launches[1] + 1, launches[0]) << "M " << M;
  }
}

// The delta rule's inputs as the forward prepares them, on the reference ops: q and k l2-normalised per head (in
// place) and q times the returned 1/sqrt(Dk); g, beta [T, Nv] from the gates.
float ref_delta_inputs(std::vector<float>& q, std::vector<float>& k, const std::vector<float>& a,
                       const std::vector<float>& b, const std::vector<float>& A, const std::vector<float>& dtb,
                       int64_t T, int64_t Nk, int64_t Nv, int64_t Dk, std::vector<float>& g, std::vector<float>& beta) {
  ref::l2norm_heads(q.data(), T * Nk, Dk, 1e-6f);
  ref::l2norm_heads(k.data(), T * Nk, Dk, 1e-6f);
  const float qs = float(1.0 / std::sqrt(double(Dk)));
  for (auto& x : q) x *= qs;
  ref::gdn_gates(a.data(), b.data(), A.data(), dtb.data(), T, Nv, g.data(), beta.data());
  return qs;
}

// The delta rule alone, and fused with the ops the forward issues before it (l2norm q, l2norm k, q scale,
// gates): against ref::gdn_recurrent after the same ref ops. T = 1 runs round 14's one-barrier delta_step_kernel
// (8 and 4 warps) and delta_kernel (step_warps 0); Dk 128 / 64 / 16.
TEST(CudaOps, DeltaRuleAloneAndFused) {
  BONSAI_REQUIRE_GPU();
  struct Case {
    int64_t T, Nk, Nv, Dk, Dv;
  } cases[] = {{1, 2, 6, 128, 128}, {7, 2, 6, 128, 128}, {33, 1, 3, 64, 64}, {2, 16, 48, 128, 128},
               {1, 16, 48, 128, 128}, {1, 1, 3, 64, 64}, {1, 2, 2, 16, 32}};
  for (int sw : {8, 4, 0})
  for (bool fuse : {true, false}) {
    CudaBackend::Options o;
    o.fuse = fuse;
    o.delta_step = sw;
    CudaBackend be(o);
    for (const Case& c : cases) {
      const size_t nq = size_t(c.T * c.Nk * c.Dk), nv = size_t(c.T * c.Nv * c.Dv), ns = size_t(c.Nv * c.Dk * c.Dv);
      const auto q0 = randn(nq, 1), k0 = randn(nq, 2), v = randn(nv, 3), s0 = randn(ns, 4, 0.1f);
      const auto a = randn(size_t(c.T * c.Nv), 5), b = randn(size_t(c.T * c.Nv), 6), A = uniform(size_t(c.Nv), 7, -2.f, -0.1f),
                 dtb = randn(size_t(c.Nv), 8);
      auto q = q0, k = k0, st = s0;
      std::vector<float> g(a.size()), beta(a.size()), want(nv);
      const float qs = ref_delta_inputs(q, k, a, b, A, dtb, c.T, c.Nk, c.Nv, c.Dk, g, beta);
      ref::gdn_recurrent(st.data(), q.data(), k.data(), v.data(), g.data(), beta.data(), c.T, c.Nk, c.Nv, c.Dk, c.Dv,
                         want.data());

      Buffer dq = up(be, q0), dk = up(be, k0), dv = up(be, v), ds = up(be, s0), da = up(be, a), db = up(be, b),
             dA = up(be, A), dd = up(be, dtb), dg = poisoned(be, a.size()), dbeta = poisoned(be, a.size()),
             out = poisoned(be, nv);
      be.l2norm_heads(dq.data(), c.T * c.Nk, c.Dk, 1e-6f);
      be.l2norm_heads(dk.data(), c.T * c.Nk, c.Dk, 1e-6f);
      be.scale(dq.data(), nq, qs);
      be.gdn_gates(da.data(), db.data(), dA.data(), dd.data(), c.T, c.Nv, dg.data(), dbeta.data());
      be.gdn_delta_rule(ds.data(), dq.data(), dk.data(), dv.data(), dg.data(), dbeta.data(), c.T, c.Nk, c.Nv, c.Dk, c.Dv,
                        out.data());
      const std::string what = "T " + std::to_string(c.T) + " Dk " + std::to_string(c.Dk) + (fuse ? " fused" : " unfused") +
                               " step warps " + std::to_string(sw);
      EXPECT_LE(rel_err(down(be, out), want), 1e-4) << what;
      EXPECT_LE(rel_err(down(be, ds), st), 1e-4) << what;
      EXPECT_LE(rel_err(down(be, dg), g), 1e-5) << what;
      EXPECT_LE(rel_err(down(be, dbeta), beta), 1e-5) << what;
      if (!fuse) {
        EXPECT_LE(rel_err(down(be, dq), q), 1e-5) << what;
        EXPECT_LE(rel_err(down(be, dk), k), 1e-5) << what;
      }
    }
  }
}

// Round 26: a decode token's delta step with the gated-norm site of its output in the same launch
// (Options::delta_site: the last block of each 1024-chunk runs site_row_kernel's body) against the step and the site
// kernel apart. The forward's ops for gdn_out's input (l2norm q / k, q scale, gates, delta rule, gated norm,
// hadamard site, the linear): the delta output, the state, the gates, the normed row, the fp32 site and the linear's
// outputs are EQUAL, the fused path launches one kernel fewer, and two tokens in a row check that the arrival
// counters are left zero. Shapes: the 27b's (48 V heads of 128: six chunks, FWHT 1024), one chunk (n 128 and 512,
// Dv 64: a 64-element norm segment), and 6 x 128 = 768 outputs (not a multiple of 1024: unfused on both).
TEST(CudaOps, DeltaStepWithGatedNormSiteEqualsApart) {
  BONSAI_REQUIRE_GPU();
  struct Case {
    int64_t Nk, Nv, Dk, Dv, n;
  } cases[] = {{16, 48, 128, 128, 1024}, {2, 8, 128, 128, 128}, {4, 16, 64, 64, 512}, {2, 6, 128, 128, 256}};
  for (const int levels : {2, 1})
    for (const int sw : {8, 4})
      for (const Case& c : cases) {
        const int64_t K = c.Nv * c.Dv, nq = c.Nk * c.Dk;
        TernaryMatrix& w = random_matrix(96, K, uint32_t(400 + K / 64), 0.02);
        const auto signs = random_signs(size_t(K), 401);
        const auto gain = uniform(size_t(c.Dv), 402, 0.5f, 1.5f), A = uniform(size_t(c.Nv), 403, -2.f, -0.1f),
                   dtb = randn(size_t(c.Nv), 404), s0 = randn(size_t(c.Nv * c.Dk * c.Dv), 405, 0.1f);
        const bool fusable = K % 1024 == 0;
        std::vector<std::vector<float>> got[2];
        uint64_t kernels[2] = {0, 0};
        for (const bool on : {true, false}) {
          CudaBackend::Options o;
          o.delta_site = on;
          o.delta_step = sw;
          o.act_levels = levels;
          CudaBackend be(o);
          be.prepare_matrix(w);
          Buffer sd = up_bytes(be, signs), gd = up(be, gain), dA = up(be, A), dd = up(be, dtb), ds = up(be, s0);
          const auto* sp = reinterpret_cast<const int8_t*>(sd.data());
          for (uint32_t tok = 0; tok < 2; ++tok) {
            const uint32_t seed = 410 + 10 * tok;
            Buffer dq = up(be, randn(size_t(nq), seed)), dk = up(be, randn(size_t(nq), seed + 1)),
                   dv = up(be, randn(size_t(K), seed + 2)), dz = up(be, randn(size_t(K), seed + 3)),
                   da = up(be, randn(size_t(c.Nv), seed + 4)), db = up(be, randn(size_t(c.Nv), seed + 5));
            Buffer dg = poisoned(be, size_t(c.Nv)), dbeta = poisoned(be, size_t(c.Nv)), out = poisoned(be, size_t(K)),
                   normed = poisoned(be, size_t(K)), st = poisoned(be, size_t(K)), yd = poisoned(be, size_t(w.rows));
            const uint64_t k0 = be.stats().kernels;
            be.l2norm_heads(dq.data(), c.Nk, c.Dk, 1e-6f);
            be.l2norm_heads(dk.data(), c.Nk, c.Dk, 1e-6f);
            be.scale(dq.data(), nq, float(1.0 / std::sqrt(double(c.Dk))));
            be.gdn_gates(da.data(), db.data(), dA.data(), dd.data(), 1, c.Nv, dg.data(), dbeta.data());
            be.gdn_delta_rule(ds.data(), dq.data(), dk.data(), dv.data(), dg.data(), dbeta.data(), 1, c.Nk, c.Nv, c.Dk,
                              c.Dv, out.data());
            be.gated_rmsnorm(out.data(), dz.data(), gd.data(), c.Nv, c.Dv, 1e-6f, normed.data());
            be.copy_rows(st.data(), K, normed.data(), K, 1, K);
            be.hadamard_forward(st.data(), 1, K, sp, c.n);
            const LinearOut lo{&w, yd.data()};
            be.linear(&lo, 1, K, st.data(), 1);
            const std::vector<float> y = down(be, yd);
            kernels[!on] += be.stats().kernels - k0;
            const std::vector<float> site = down(be, st);
            EXPECT_LE(rel_err(y, quantised_reference(w, site, 1, levels)), 1e-4) << "token " << tok;
            for (auto v : {down(be, out), down(be, ds), down(be, dg), down(be, dbeta), down(be, normed), site, y})
              got[!on].push_back(v);
          }
        }
        const std::string what = "levels " + std::to_string(levels) + " warps " + std::to_string(sw) + " K " +
                                 std::to_string(K) + " n " + std::to_string(c.n);
        ASSERT_EQ(got[0].size(), got[1].size()) << what;
        const char* names[] = {"delta out", "state", "g", "beta", "normed", "site", "linear"};
        for (size_t i = 0; i < got[0].size(); ++i)
          EXPECT_EQ(got[0][i], got[1][i]) << what << " token " << i / 7 << " " << names[i % 7];
        EXPECT_EQ(kernels[0] + (fusable ? 2 : 0), kernels[1]) << what << " (one launch fewer a token where fused)";
      }
}

// Round 29: a decode token's GDN inputs (the dense a / b pair, the conv of q | k | v) computed by the delta step's own
// launch (Options::delta_conv) against conv_dense_kernel + the step apart. The forward's op sequence from the a / b
// projections to gdn_out's linear (with and without the gated-norm site after the step, which fuses as well): the
// delta output, the recurrent state, the conv state, the gates and the site's outputs are EQUAL, the fused path
// launches one kernel fewer a token, three tokens in a row check that the per-K-head counters are left zero (and the
// conv state carried), and the delta output matches the fp64 reference of the same ops. Shapes: the 27b's (16 K / 48
// V heads of 128, E 5,120, C 10,240, 4 taps), a small one (2 / 6 heads), Dk = Dv = 64 (half the threads without a
// q / k channel) with 2 taps; a / b weights bf16 (as the packs' ssm_alpha / ssm_beta) and fp32.
TEST(CudaOps, DeltaStepWithConvEqualsApart) {
  BONSAI_REQUIRE_GPU();
  struct Case {
    int64_t Nk, Nv, Dk, Dv, E, Kc;
    bool bf16;
  } cases[] = {{16, 48, 128, 128, 5120, 4, true}, {2, 6, 128, 128, 256, 4, false}, {4, 8, 64, 64, 384, 2, true},
               {16, 48, 128, 128, 5120, 4, false}};
  for (const bool with_site : {true, false})
    for (const Case& c : cases) {
      const int64_t KD = c.Nk * c.Dk, VD = c.Nv * c.Dv, C = 2 * KD + VD;
      int64_t hb = 1024;  // the site's FWHT block: the largest power of two <= 1024 dividing VD
      while (VD % hb != 0) hb /= 2;
      static std::deque<std::vector<float>> keep;  // host weights outlive the backends' constants keyed by address
      keep.push_back(randn(size_t(c.Nv * c.E), uint32_t(500 + c.E), 0.05f));
      if (c.bf16) keep.back() = bf16_exact(keep.back());
      const std::vector<float>& wa = keep.back();
      keep.push_back(randn(size_t(c.Nv * c.E), uint32_t(501 + c.E), 0.05f));
      if (c.bf16) keep.back() = bf16_exact(keep.back());
      const std::vector<float>& wb = keep.back();
      TernaryMatrix& w = random_matrix(96, VD, uint32_t(510 + VD / 64), 0.02);
      const auto signs = random_signs(size_t(VD), 511);
      const auto taps = randn(size_t(C * c.Kc), 512, 0.5f), cs0 = randn(size_t((c.Kc - 1) * C), 513),
                 gain = uniform(size_t(c.Dv), 514, 0.5f, 1.5f), A = uniform(size_t(c.Nv), 515, -2.f, -0.1f),
                 dtb = randn(size_t(c.Nv), 516), s0 = randn(size_t(c.Nv * c.Dk * c.Dv), 517, 0.1f);
      constexpr int kTokens = 3;
      std::vector<std::vector<float>> got[2];
      uint64_t kernels[2] = {0, 0};
      for (const bool on : {true, false}) {
        CudaBackend::Options o;
        o.delta_conv = on;
        o.delta_site = with_site;
        CudaBackend be(o);
        be.prepare_matrix(w);
        be.upload_constant(wa.data(), wa.size() * 4, true);
        be.upload_constant(wb.data(), wb.size() * 4, true);
        Buffer sd = up_bytes(be, signs), gd = up(be, gain), dA = up(be, A), dd = up(be, dtb), ds = up(be, s0),
               dt = up(be, taps), dcs = up(be, cs0);
        const auto* sp = reinterpret_cast<const int8_t*>(sd.data());
        std::vector<float> ref_cs = cs0, ref_s = s0;  // the reference's carried conv and recurrent state
        for (uint32_t tok = 0; tok < kTokens; ++tok) {
          const uint32_t seed = 520 + 10 * tok;
          const auto x = randn(size_t(C), seed), dxh = randn(size_t(c.E), seed + 1), z = randn(size_t(VD), seed + 2);
          Buffer dx = up(be, x), dnx = up(be, dxh), dz = up(be, z);
          Buffer da = poisoned(be, size_t(c.Nv)), db = poisoned(be, size_t(c.Nv)), conv = poisoned(be, size_t(C)),
                 dg = poisoned(be, size_t(c.Nv)), dbeta = poisoned(be, size_t(c.Nv)), out = poisoned(be, size_t(VD)),
                 normed = poisoned(be, size_t(VD)), st = poisoned(be, size_t(VD)), yd = poisoned(be, size_t(w.rows));
          const uint64_t k0 = be.stats().kernels;
          be.dense_linear(wa.data(), c.Nv, c.E, dnx.data(), 1, da.data());
          be.dense_linear(wb.data(), c.Nv, c.E, dnx.data(), 1, db.data());
          be.gdn_conv(dx.data(), dcs.data(), dt.data(), 1, C, c.Kc, conv.data());
          float *q = conv.data(), *k = conv.data() + KD, *v = conv.data() + 2 * KD;
          be.l2norm_heads(q, c.Nk, c.Dk, 1e-6f);
          be.l2norm_heads(k, c.Nk, c.Dk, 1e-6f);
          be.scale(q, size_t(KD), float(1.0 / std::sqrt(double(c.Dk))));
          be.gdn_gates(da.data(), db.data(), dA.data(), dd.data(), 1, c.Nv, dg.data(), dbeta.data());
          be.gdn_delta_rule(ds.data(), q, k, v, dg.data(), dbeta.data(), 1, c.Nk, c.Nv, c.Dk, c.Dv, out.data());
          be.gated_rmsnorm(out.data(), dz.data(), gd.data(), c.Nv, c.Dv, 1e-6f, normed.data());
          be.copy_rows(st.data(), VD, normed.data(), VD, 1, VD);
          be.hadamard_forward(st.data(), 1, VD, sp, hb);
          const LinearOut lo{&w, yd.data()};
          be.linear(&lo, 1, VD, st.data(), 1);
          const std::vector<float> y = down(be, yd);
          kernels[!on] += be.stats().kernels - k0;
          for (auto vec : {down(be, out), down(be, ds), down(be, dcs), down(be, dg), down(be, dbeta), down(be, st), y})
            got[!on].push_back(vec);
          if (on) {  // the fp64 reference of the same ops (the fused path's values)
            std::vector<float> ca(size_t(c.Nv)), cb(size_t(c.Nv)), cv(static_cast<size_t>(C)), g(size_t(c.Nv)), beta(size_t(c.Nv)),
                want(static_cast<size_t>(VD));
            ref::dense_matmul_f32(wa.data(), c.Nv, c.E, dxh.data(), 1, ca.data());
            ref::dense_matmul_f32(wb.data(), c.Nv, c.E, dxh.data(), 1, cb.data());
            ref::gdn_conv(x.data(), ref_cs.data(), taps.data(), 1, C, c.Kc, cv.data());
            std::vector<float> rq(cv.begin(), cv.begin() + KD), rk(cv.begin() + KD, cv.begin() + 2 * KD),
                rv(cv.begin() + 2 * KD, cv.end());
            ref_delta_inputs(rq, rk, ca, cb, A, dtb, 1, c.Nk, c.Nv, c.Dk, g, beta);
            ref::gdn_recurrent(ref_s.data(), rq.data(), rk.data(), rv.data(), g.data(), beta.data(), 1, c.Nk, c.Nv,
                               c.Dk, c.Dv, want.data());
            const std::string at = "E " + std::to_string(c.E) + " token " + std::to_string(tok);
            EXPECT_LE(rel_err(down(be, out), want), 1e-4) << at;
            EXPECT_LE(rel_err(down(be, ds), ref_s), 1e-4) << at;
            EXPECT_EQ(down(be, dcs), ref_cs) << at << ": the conv state is a shift of exact values";
          }
        }
      }
      const std::string what = std::string(with_site ? "site" : "no site") + " Nv " + std::to_string(c.Nv) + " Dk " +
                               std::to_string(c.Dk) + " E " + std::to_string(c.E) + (c.bf16 ? " bf16" : " fp32");
      ASSERT_EQ(got[0].size(), got[1].size()) << what;
      const char* names[] = {"delta out", "state", "conv state", "g", "beta", "site", "linear"};
      for (size_t i = 0; i < got[0].size(); ++i)
        EXPECT_EQ(got[0][i], got[1][i]) << what << " token " << i / 7 << " " << names[i % 7];
      EXPECT_EQ(kernels[0] + kTokens, kernels[1]) << what << " (one launch fewer a token)";
    }
}

// Round 31: a decode token's GDN out projection in the delta step's launch (Options::delta_out) against the step (+
// site) and v7's product apart, through the forward's op sequence from the delta rule's inputs to the next layer's
// first product (the add + rmsnorm of the projection into the residual, then a product reading the normed row):
// the delta output, the recurrent state, the conv state, the gates and the site's fp32 output are EQUAL (the fused
// step computes them unchanged), the residual after the add and the normed row within 2e-5 of apart (the
// projection's sums run per 1,024-chunk, then over the chunks), the projection (read back from the residual's change)
// within 1e-4 of the quantised reference of the site's digits, and the next product within 1e-4 of the quantised
// reference of the normed row it read. Three tokens in a row check the
// chunk flags are left zero; the fused path launches one kernel fewer a token (the AddNorm site sums the partials).
// Shapes: the 27b's (16 K / 48 V heads of 128, D 5,120, with the fused conv, bf16 a / b), the tiny pack's (8 / 24,
// D 1,024) and one chunk (2 / 8, D 1,024, E 256), without the conv too, q16 and q8.
TEST(CudaOps, DeltaStepWithOutProjectionEqualsApart) {
  BONSAI_REQUIRE_GPU();
  struct Case {
    int64_t Nk, Nv, D, E;
    bool conv;
  } cases[] = {{16, 48, 5120, 5120, true}, {8, 24, 1024, 1024, true}, {2, 8, 1024, 256, false}, {16, 48, 5120, 5120, false}};
  constexpr int64_t Dk = 128, Dv = 128, Kc = 4;
  for (const int levels : {2, 1})
    for (const Case& c : cases) {
      const int64_t KD = c.Nk * Dk, VD = c.Nv * Dv, C = 2 * KD + VD;
      static std::deque<std::vector<float>> keep;  // host weights outlive the backends' constants keyed by address
      keep.push_back(bf16_exact(randn(size_t(c.Nv * c.E), uint32_t(600 + c.E), 0.05f)));
      const std::vector<float>& wa = keep.back();
      keep.push_back(bf16_exact(randn(size_t(c.Nv * c.E), uint32_t(601 + c.E), 0.05f)));
      const std::vector<float>& wb = keep.back();
      TernaryMatrix& w = random_matrix(c.D, VD, uint32_t(610 + VD / 64), 0.02);      // gdn_out [D, Nv Dv]
      TernaryMatrix& w2 = random_matrix(256, c.D, uint32_t(611 + c.D / 64), 0.02);   // the next layer's product
      const auto signs = random_signs(size_t(VD), 612);
      const auto taps = randn(size_t(C * Kc), 613, 0.5f), cs0 = randn(size_t((Kc - 1) * C), 614),
                 gain = uniform(size_t(Dv), 615, 0.5f, 1.5f), A = uniform(size_t(c.Nv), 616, -2.f, -0.1f),
                 dtb = randn(size_t(c.Nv), 617), s0 = randn(size_t(c.Nv * Dk * Dv), 618, 0.1f),
                 h0 = randn(size_t(c.D), 619), gain2 = uniform(size_t(c.D), 620, 0.5f, 1.5f);
      constexpr int kTokens = 3;
      std::vector<std::vector<float>> same[2], close[2];
      std::vector<float> h_before;
      uint64_t kernels[2] = {0, 0};
      const std::string what = "Nv " + std::to_string(c.Nv) + " D " + std::to_string(c.D) + (c.conv ? " conv" : "") +
                               (levels == 2 ? " q16" : " q8");
      for (const bool on : {true, false}) {
        CudaBackend::Options o;
        o.delta_out = on;
        o.delta_conv = c.conv;
        o.act_levels = levels;
        CudaBackend be(o);
        be.prepare_matrix(w);
        be.prepare_matrix(w2);
        be.upload_constant(wa.data(), wa.size() * 4, true);
        be.upload_constant(wb.data(), wb.size() * 4, true);
        Buffer sd = up_bytes(be, signs), gd = up(be, gain), dA = up(be, A), dd = up(be, dtb), ds = up(be, s0),
               dt = up(be, taps), dcs = up(be, cs0), dh = up(be, h0), dg2 = up(be, gain2);
        const auto* sp = reinterpret_cast<const int8_t*>(sd.data());
        for (uint32_t tok = 0; tok < kTokens; ++tok) {
          const uint32_t seed = 630 + 10 * tok;
          Buffer dx = up(be, randn(size_t(C), seed)), dnx = up(be, randn(size_t(c.E), seed + 1)),
                 dz = up(be, randn(size_t(VD), seed + 2));
          Buffer da = poisoned(be, size_t(c.Nv)), db = poisoned(be, size_t(c.Nv)), conv = poisoned(be, size_t(C)),
                 dg = poisoned(be, size_t(c.Nv)), dbeta = poisoned(be, size_t(c.Nv)), out = poisoned(be, size_t(VD)),
                 normed = poisoned(be, size_t(VD)), st = poisoned(be, size_t(VD)), yd = poisoned(be, size_t(c.D)),
                 xn = poisoned(be, size_t(c.D)), y2 = poisoned(be, size_t(w2.rows));
          if (on) h_before = down(be, dh);
          const uint64_t k0 = be.stats().kernels;
          be.dense_linear(wa.data(), c.Nv, c.E, dnx.data(), 1, da.data());
          be.dense_linear(wb.data(), c.Nv, c.E, dnx.data(), 1, db.data());
          be.gdn_conv(dx.data(), dcs.data(), dt.data(), 1, C, Kc, conv.data());
          float *q = conv.data(), *k = conv.data() + KD, *v = conv.data() + 2 * KD;
          be.l2norm_heads(q, c.Nk, Dk, 1e-6f);
          be.l2norm_heads(k, c.Nk, Dk, 1e-6f);
          be.scale(q, size_t(KD), float(1.0 / std::sqrt(double(Dk))));
          be.gdn_gates(da.data(), db.data(), dA.data(), dd.data(), 1, c.Nv, dg.data(), dbeta.data());
          be.gdn_delta_rule(ds.data(), q, k, v, dg.data(), dbeta.data(), 1, c.Nk, c.Nv, Dk, Dv, out.data());
          be.gated_rmsnorm(out.data(), dz.data(), gd.data(), c.Nv, Dv, 1e-6f, normed.data());
          be.copy_rows(st.data(), VD, normed.data(), VD, 1, VD);
          be.hadamard_forward(st.data(), 1, VD, sp, 1024);
          const LinearOut lo{&w, yd.data()};
          be.linear(&lo, 1, VD, st.data(), 1);
          be.add_rmsnorm(dh.data(), yd.data(), 1, c.D, dg2.data(), 1e-6f, xn.data());
          const LinearOut lo2{&w2, y2.data()};
          be.linear(&lo2, 1, c.D, xn.data(), 1);
          const std::vector<float> h = down(be, dh);
          kernels[!on] += be.stats().kernels - k0;
          const std::vector<float> site = down(be, st);
          for (auto vec : {down(be, out), down(be, ds), down(be, dcs), down(be, dg), down(be, dbeta), site})
            same[!on].push_back(vec);
          const std::vector<float> xnh = down(be, xn);
          for (auto vec : {h, xnh}) close[!on].push_back(vec);
          // The next product against the quantised reference of its own input (a digit of xn may round the other
          // way between the paths: under q8 one such step moves y2 by ~1e-4 of its max, so not compared across).
          EXPECT_LE(rel_err(down(be, y2), quantised_reference(w2, xnh, 1, levels)), 1e-4) << what << " token " << tok;
          if (on) {  // the projection, as the residual's change, against the quantised reference of the site
            std::vector<float> y(h.size());
            for (size_t i = 0; i < h.size(); ++i) y[i] = h[i] - h_before[i];
            EXPECT_LE(rel_err(y, quantised_reference(w, site, 1, levels)), 1e-4) << what << " token " << tok;
          }
        }
      }
      ASSERT_EQ(same[0].size(), same[1].size()) << what;
      const char* names[] = {"delta out", "state", "conv state", "g", "beta", "site"};
      for (size_t i = 0; i < same[0].size(); ++i)
        EXPECT_EQ(same[0][i], same[1][i]) << what << " token " << i / 6 << " " << names[i % 6];
      const char* near[] = {"residual", "normed row"};
      for (size_t i = 0; i < close[0].size(); ++i)
        EXPECT_LE(rel_err(close[0][i], close[1][i]), 2e-5) << what << " token " << i / 2 << " " << near[i % 2];
      EXPECT_EQ(kernels[0] + kTokens, kernels[1]) << what << " (one launch fewer a token)";
    }
}

// Round 29 (host only: runs in CI): where the delta step takes the conv and a / b pair into its launch.
TEST(CudaPolicy, DeltaConvSupported) {
  alignas(16) static float conv_out[10240], x[10240], state[3 * 10240], taps[4 * 10240], dx[5120], wa[48 * 5120],
      wb[48 * 5120], ab[96], st[48 * 128 * 128], o[6144];
  alignas(16) static int32_t count[16];
  cuda::DeltaDesc d{};
  d.state = st;
  d.q = conv_out;
  d.k = conv_out + 2048;
  d.v = conv_out + 4096;
  d.out = o;
  d.a = ab;
  d.b = ab + 48;
  d.A = ab;
  d.dt_bias = ab;
  d.T = 1;
  d.Nk = 16;
  d.Nv = 48;
  d.Dk = d.Dv = 128;
  d.step_warps = 8;
  cuda::DeltaConvIn c{x, state, taps, conv_out, wa, wb, dx, count, 10240, 4, 5120, true};
  EXPECT_TRUE(cuda::delta_conv_supported(d, c));  // the 27b's decode token
  auto without = [&](auto change) {
    cuda::DeltaDesc e = d;
    cuda::DeltaConvIn f = c;
    change(e, f);
    return !cuda::delta_conv_supported(e, f);
  };
  EXPECT_TRUE(without([](cuda::DeltaDesc& e, cuda::DeltaConvIn&) { e.step_warps = 4; }));  // dense_block's 256 threads
  EXPECT_TRUE(without([](cuda::DeltaDesc& e, cuda::DeltaConvIn&) { e.T = 2; }));
  EXPECT_TRUE(without([](cuda::DeltaDesc& e, cuda::DeltaConvIn&) { e.a = nullptr; }));  // gates not folded
  EXPECT_TRUE(without([](cuda::DeltaDesc& e, cuda::DeltaConvIn&) { e.v = conv_out + 4097; }));  // past the conv row
  EXPECT_TRUE(without([](cuda::DeltaDesc& e, cuda::DeltaConvIn&) { e.q = x; }));               // another buffer
  EXPECT_TRUE(without([](cuda::DeltaDesc&, cuda::DeltaConvIn& f) { f.Kc = 9; }));
  EXPECT_TRUE(without([](cuda::DeltaDesc&, cuda::DeltaConvIn& f) { f.E = 5124; }));
  EXPECT_TRUE(without([](cuda::DeltaDesc&, cuda::DeltaConvIn& f) { f.dx = dx + 1; }));  // misaligned
  EXPECT_TRUE(without([](cuda::DeltaDesc&, cuda::DeltaConvIn& f) { f.count = nullptr; }));
  EXPECT_TRUE(without([](cuda::DeltaDesc& e, cuda::DeltaConvIn&) {
    e.Dk = 192;  // 2 Dk > 256: not a q / k channel a thread
    e.Nk = 1;
  }));
  // Off by default: correct on a device (round 33) but slower (H100: tg128 196.8 vs 200.3 tok/s).
  EXPECT_FALSE(CudaBackend::Options{}.delta_conv);
}

// The 27b's AddNorm decode site (K 5,120, Hadamard block 1,024) over 16-byte-aligned host stand-ins, for the host rules.
cuda::SiteDesc add_norm_row_site() {
  alignas(16) static float src[16], resid[16], gain[16];
  alignas(16) static int8_t xq[16];
  alignas(16) static float2 xds[16];
  cuda::SiteDesc d;
  d.pre = cuda::kPreAddNorm;
  d.src = src;
  d.resid = resid;
  d.gain = gain;
  d.xq = xq;
  d.xds = xds;
  d.K = d.ld = 5120;
  d.n = 1024;
  return d;
}

// Round 27: the 128-thread add + rmsnorm site keeps its programmatic (early) launch at one row only; at 5-32 decode rows
// an early launch failed on the H200 (docs/cuda-kernels.md, round 27), so several rows start after their predecessor.
// Host only (runs in CI): the launch record's grid, block and edge flag.
TEST(CudaPolicy, RowNormSiteLaunchesEarlyAtOneRowOnly) {
  cuda::SiteDesc d = add_norm_row_site();
  for (const int64_t rows : {int64_t(1), int64_t(2), int64_t(5), int64_t(32)}) {
    d.rows = rows;
    ASSERT_TRUE(cuda::site_row_norm_supported(d)) << rows;
    const cuda::Launch l = cuda::site_row_norm_launch(d);
    EXPECT_EQ(l.grid.x, 5u) << rows;  // one block per 1024-element tile, the row's cluster
    EXPECT_EQ(l.grid.y, unsigned(rows));
    EXPECT_EQ(l.block.x, 128u);
    EXPECT_EQ(l.serial_in, rows > 1) << rows;
    // Round 28: Options::site_row_norm_early moves the limit (the default backend's value: 1).
    EXPECT_EQ(cuda::site_row_norm_launch(d, 4).serial_in, rows > 4) << rows;
  }
  EXPECT_EQ(CudaBackend::Options{}.site_row_norm_early, 1);
  d.rows = 64;  // prefill rows: the warp site's
  EXPECT_FALSE(cuda::site_row_norm_supported(d));
  d.rows = 1;
  d.gain = nullptr;
  EXPECT_FALSE(cuda::site_row_norm_supported(d));
}

// The AddNorm row site sums ffn_fused's chunk partials itself (SiteDesc::nparts) for one row whose parts are whole,
// 16-byte-aligned rows; not for several rows (the parts hold one), a stride shorter than the row or misaligned; the v7
// site prologue, which reads one source, never takes them. Host only (CI).
TEST(CudaPolicy, RowNormSiteTakesChunkPartialsOfOneRow) {
  cuda::SiteDesc d = add_norm_row_site();
  d.rows = 1;
  d.nparts = 17;
  d.part_stride = 5120;
  EXPECT_TRUE(cuda::site_row_norm_supported(d));
  EXPECT_FALSE(cuda::matvec7_site_supported(d));
  d.part_stride = 5122;
  EXPECT_FALSE(cuda::site_row_norm_supported(d));
  d.part_stride = 4096;
  EXPECT_FALSE(cuda::site_row_norm_supported(d));
  d.part_stride = 5120;
  d.rows = 2;
  EXPECT_FALSE(cuda::site_row_norm_supported(d));
  d.rows = 1;
  d.nparts = 1;
  EXPECT_TRUE(cuda::matvec7_site_supported(d));
  // round 33: on by default with the tensor-map ffn_down copies (H100: tg128 212.7 vs 199.7 / 200.7 tok/s)
  EXPECT_TRUE(CudaBackend::Options{}.ffn_fused);
  EXPECT_EQ(CudaBackend::Options{}.ffn_b_copy, 2);
  EXPECT_EQ(CudaBackend::Options{}.ffn_balance, 0);
  // round 37: on (H100: the barrier 0.3 us faster in the kernel bench, tg128 +0.5-1.1 %; the gate 726/726)
  EXPECT_TRUE(CudaBackend::Options{}.ffn_release);
}

// Round 26: where the delta step takes the gated-norm site into its launch (host only: runs in CI). The 27b's decode
// token (48 V heads of 128, the site over the 6,144 outputs) fuses; a prefill chunk, batched rows, delta_kernel (step
// warps 0), another pre-op, a site of another buffer, a row count other than one, outputs not a multiple of 1024
// (the chunk's 32 blocks) or a misaligned output do not.
// The 27b's decode delta step (8 warps) and the gated-norm site of its output, as delta_site_supported takes them
// (host-only rule tests; out is the static float [16] the site reads, for the tests that move it).
struct DeltaSiteCase {
  cuda::DeltaDesc d{};
  cuda::SiteDesc s;
  float* out;
};
DeltaSiteCase delta_site_case() {
  alignas(16) static float out[16], z[16], gain[16];
  alignas(16) static int8_t xq[16];
  alignas(16) static float2 xds[16];
  DeltaSiteCase c;
  c.out = out;
  c.d.T = 1;
  c.d.Nk = 16;
  c.d.Nv = 48;
  c.d.Dk = c.d.Dv = 128;
  c.d.out = out;
  c.d.step_warps = 8;
  c.s.pre = cuda::kPreGatedNorm;
  c.s.src = out;
  c.s.src2 = z;
  c.s.gain = gain;
  c.s.seg = 128;
  c.s.xq = xq;
  c.s.xds = xds;
  c.s.rows = 1;
  c.s.K = c.s.ld = 48 * 128;
  c.s.n = 1024;
  return c;
}

TEST(CudaPolicy, DeltaSiteSupported) {
  DeltaSiteCase c = delta_site_case();
  cuda::DeltaDesc& d = c.d;
  cuda::SiteDesc& s = c.s;
  float* out = c.out;
  float* z = const_cast<float*>(s.src2);
  EXPECT_TRUE(cuda::delta_site_supported(d, s));
  d.step_warps = 4;
  EXPECT_TRUE(cuda::delta_site_supported(d, s));
  auto without = [&](auto change) {
    cuda::DeltaDesc d2 = d;
    cuda::SiteDesc s2 = s;
    change(d2, s2);
    return cuda::delta_site_supported(d2, s2);
  };
  EXPECT_FALSE(without([](cuda::DeltaDesc& dd, cuda::SiteDesc&) { dd.T = 2; }));
  EXPECT_FALSE(without([](cuda::DeltaDesc& dd, cuda::SiteDesc&) { dd.step_warps = 0; }));
  static const cuda::RowTable rows{};
  EXPECT_FALSE(without([](cuda::DeltaDesc& dd, cuda::SiteDesc&) { dd.rows = &rows; }));
  EXPECT_FALSE(without([](cuda::DeltaDesc&, cuda::SiteDesc& ss) { ss.pre = cuda::kPreSiluMul; }));
  EXPECT_FALSE(without([z](cuda::DeltaDesc&, cuda::SiteDesc& ss) { ss.src = z; }));
  EXPECT_FALSE(without([](cuda::DeltaDesc&, cuda::SiteDesc& ss) { ss.rows = 2; }));
  EXPECT_FALSE(without([](cuda::DeltaDesc& dd, cuda::SiteDesc& ss) {  // 768 outputs
    dd.Nv = 6;
    ss.K = ss.ld = 6 * 128;
    ss.n = 256;
  }));
  EXPECT_FALSE(without([out](cuda::DeltaDesc& dd, cuda::SiteDesc& ss) {
    dd.out = out + 1;
    ss.src = out + 1;
  }));
}

// Round 31 (runs in CI, host only there): where the delta step takes the out projection into its launch. The rule's
// residency half (delta_out_resident) asks the device: without one it says no.
TEST(CudaPolicy, DeltaOutSupported) {
  alignas(16) static float parts[16];
  alignas(16) static uint32_t words[16];
  alignas(16) static uint16_t scales[16];
  static int32_t flags[16];
  DeltaSiteCase c = delta_site_case();
  cuda::DeltaDesc& d = c.d;
  cuda::SiteDesc& s = c.s;
  s.levels = 2;
  cuda::DeltaOutDesc o;
  o.words = words;
  o.scales = scales;
  o.parts = parts;
  o.flags = flags;
  o.D = 5120;
  d.site = &s;
  d.out_proj = &o;
  EXPECT_TRUE(cuda::delta_out_supported(d)) << "the 27b's gdn_out";
  auto with = [&](auto change) {
    cuda::DeltaDesc d2 = d;
    cuda::SiteDesc s2 = s;
    cuda::DeltaOutDesc o2 = o;
    d2.site = &s2;
    d2.out_proj = &o2;
    change(d2, s2, o2);
    return cuda::delta_out_supported(d2);
  };
  using D = cuda::DeltaDesc;
  using S = cuda::SiteDesc;
  using O = cuda::DeltaOutDesc;
  EXPECT_TRUE(with([](D&, S& ss, O&) { ss.levels = 1; }));
  EXPECT_TRUE(with([](D&, S&, O& oo) { oo.D = 1024; })) << "the tiny pack's";
  EXPECT_TRUE(with([](D&, S&, O& oo) { oo.D = 8192; })) << "256 rows a block, the most";
  EXPECT_FALSE(with([](D&, S&, O& oo) { oo.D = 8704; })) << "272 rows a block";
  EXPECT_FALSE(with([](D&, S&, O& oo) { oo.D = 5120 + 256; })) << "D % 512";
  EXPECT_FALSE(with([](D& dd, S&, O&) { dd.out_proj = nullptr; }));
  EXPECT_FALSE(with([](D& dd, S&, O&) { dd.site = nullptr; })) << "the projection reads the fused site's digits";
  EXPECT_FALSE(with([](D& dd, S&, O&) { dd.step_warps = 4; })) << "8 warps: 4 steps x 2 row blocks";
  EXPECT_FALSE(with([](D&, S& ss, O&) { ss.rows = 2; })) << "the site unfusable";
  EXPECT_FALSE(with([](D&, S&, O& oo) { oo.flags = nullptr; }));
  EXPECT_FALSE(with([](D&, S&, O& oo) { oo.parts = parts + 1; })) << "16-byte aligned partials";
  EXPECT_FALSE(with([](D&, S&, O& oo) { oo.words = words + 1; })) << "16-byte aligned words (cp.async)";
  // 192 blocks of 256 threads at <= 128 registers: two an SM on an H100 / H200's 132; none without a device.
  EXPECT_FALSE(CudaBackend::Options{}.delta_out);  // off: measured slower (round 33, H100: tg128 198.1 vs 200.3)
  EXPECT_EQ(cuda::delta_out_resident(d, 132), cuda_device_count() > 0);
  EXPECT_FALSE(cuda::delta_out_resident(d, 95)) << "190 blocks resident at most";
}

// Round 8b: the chunked (WY) delta rule (delta_chunk.cu, Options::delta = 2) against ref::gdn_recurrent, fused and
// unfused, on chunk tails (1, 5, 63, 64, 65, 131, 200, 300 tokens: one partial chunk, exactly one, one plus a token,
// 2 + 3, 3 + 8, 4 + 44), Dk = 64, 6 to 48 V heads, a nonzero initial state, and the state carried over two calls
// (100 + 93 tokens vs 193 in one go). Each case runs round 12's tensor-core kernels (Options::delta_mma, 3xTF32),
// round 8b's FFMA kernels and the token-by-token kernel (delta = 1). fp32: chunked vs token order ~1e-6 (round 8b);
// the bound 5e-5 of max |want| holds for all three; the largest error of each path is printed.
TEST(CudaOps, DeltaRuleChunkedMatchesRecurrent) {
  BONSAI_REQUIRE_GPU();
  struct Case {
    int64_t T, Nk, Nv, Dk, Dv, split;  // split > 0: two calls, split tokens then the rest
  } cases[] = {{1, 2, 6, 128, 128, 0},   {5, 2, 6, 128, 128, 0},     {63, 2, 6, 128, 128, 0},
               {64, 2, 6, 128, 128, 0},  {65, 2, 6, 128, 128, 0},    {200, 2, 6, 128, 128, 0},
               {65, 1, 3, 64, 64, 0},    {193, 2, 6, 128, 128, 100}, {256, 16, 48, 128, 128, 0},
               {131, 4, 8, 128, 128, 0}, {300, 16, 48, 128, 128, 0}};
  struct Path {
    int delta;
    bool mma;
    const char* name;
  } paths[] = {{2, true, "chunked mma"}, {2, false, "chunked ffma"}, {1, false, "token loop"}};
  for (const Path& path : paths) {
    double worst_out = 0, worst_state = 0;
    for (bool fuse : {true, false}) {
      CudaBackend::Options o;
      o.fuse = fuse;
      o.delta = path.delta;
      o.delta_mma = path.mma;
      CudaBackend be(o);
      uint32_t seed = 100;
      for (const Case& c : cases) {
        const size_t nq = size_t(c.T * c.Nk * c.Dk), nv = size_t(c.T * c.Nv * c.Dv), ns = size_t(c.Nv * c.Dk * c.Dv);
        const auto q0 = randn(nq, seed++), k0 = randn(nq, seed++), v = randn(nv, seed++), s0 = randn(ns, seed++, 0.1f);
        const auto a = randn(size_t(c.T * c.Nv), seed++), b = randn(size_t(c.T * c.Nv), seed++),
                   A = uniform(size_t(c.Nv), seed++, -2.f, -0.1f), dtb = randn(size_t(c.Nv), seed++);
        auto q = q0, k = k0, st = s0;
        std::vector<float> g(a.size()), beta(a.size()), want(nv);
        const float qs = ref_delta_inputs(q, k, a, b, A, dtb, c.T, c.Nk, c.Nv, c.Dk, g, beta);
        ref::gdn_recurrent(st.data(), q.data(), k.data(), v.data(), g.data(), beta.data(), c.T, c.Nk, c.Nv, c.Dk,
                           c.Dv, want.data());

        Buffer dq = up(be, q0), dk = up(be, k0), dv = up(be, v), ds = up(be, s0), da = up(be, a), db = up(be, b),
               dA = up(be, A), dd = up(be, dtb), dg = poisoned(be, a.size()), dbeta = poisoned(be, a.size()),
               out = poisoned(be, nv);
        const int64_t parts[2][2] = {{0, c.split > 0 ? c.split : c.T}, {c.split > 0 ? c.split : c.T, c.T}};
        for (const auto& pr : parts) {
          const int64_t t0 = pr[0], T = pr[1] - pr[0];
          if (T == 0) continue;
          float *pq = dq.data() + t0 * c.Nk * c.Dk, *pk = dk.data() + t0 * c.Nk * c.Dk;
          float *pg = dg.data() + t0 * c.Nv, *pb = dbeta.data() + t0 * c.Nv;
          be.l2norm_heads(pq, T * c.Nk, c.Dk, 1e-6f);
          be.l2norm_heads(pk, T * c.Nk, c.Dk, 1e-6f);
          be.scale(pq, size_t(T * c.Nk * c.Dk), qs);
          be.gdn_gates(da.data() + t0 * c.Nv, db.data() + t0 * c.Nv, dA.data(), dd.data(), T, c.Nv, pg, pb);
          be.gdn_delta_rule(ds.data(), pq, pk, dv.data() + t0 * c.Nv * c.Dv, pg, pb, T, c.Nk, c.Nv, c.Dk, c.Dv,
                            out.data() + t0 * c.Nv * c.Dv);
        }
        const std::string what = "T " + std::to_string(c.T) + " Dk " + std::to_string(c.Dk) + " Nv " +
                                 std::to_string(c.Nv) + " split " + std::to_string(c.split) +
                                 (fuse ? " fused " : " unfused ") + path.name;
        const auto got = down(be, out);
        const double e_out = rel_err(got, want), e_state = rel_err(down(be, ds), st);
        worst_out = std::max(worst_out, e_out);
        worst_state = std::max(worst_state, e_state);
        EXPECT_LE(e_out, 5e-5) << what;
        EXPECT_LE(e_state, 5e-5) << what;
        EXPECT_LE(rel_err(down(be, dg), g), 1e-5) << what;
        EXPECT_LE(rel_err(down(be, dbeta), beta), 1e-5) << what;
        // Last token alone: a wrong tail chunk would show here even when the bulk is right.
        const std::vector<float> gl(got.end() - c.Nv * c.Dv, got.end()), wl(want.end() - c.Nv * c.Dv, want.end());
        EXPECT_LE(rel_err(gl, wl), 5e-5) << what << " (last token)";
      }
    }
    std::printf("delta rule, %s: largest error (of max |want|) output %.3g, state %.3g\n", path.name, worst_out,
                worst_state);
  }
}

// The forward splits the conv output [T, C = 2 Nk Dk + Nv Dv] into q, k, v with three strided copies before the
// delta rule (M > 1); with fusion on the delta rule reads them in place (row strides C) and the copies are not
// launched. Token loop, chunked form and the batched rows (one state per row) against ref::gdn_recurrent; the
// fused step must also launch at least 3 fewer kernels than the unfused one. Batched rows in column slices
// (Options::delta_rows_split 2 / 4) must equal one block per state bit for bit.
TEST(CudaOps, DeltaRuleReadsQkvInPlaceFromTheConvOutput) {
  BONSAI_REQUIRE_GPU();
  const int64_t Nk = 2, Nv = 6, Dk = 128, Dv = 128, KD = Nk * Dk, VD = Nv * Dv, C = 2 * KD + VD;
  struct Case {
    int64_t T;
    int mode;   // Options::delta: 1 token loop, 2 chunked
    bool rows;  // batched: row m is one token of sequence m
    int step_warps = 8;  // Options::delta_step (T = 1 of one sequence)
    int rows_warps = 8;  // Options::delta_rows (batched rows; 0: delta_kernel)
    int rows_split = 1;  // Options::delta_rows_split (column slices per state; round 22)
  } cases[] = {{3, 1, false},           {70, 2, false},           {70, 1, false},        {5, 1, true},
               {32, 1, true},           {5, 1, true, 8, 16},      {32, 1, true, 8, 16},  {32, 1, true, 8, 0},
               {1, 1, false},           {1, 1, false, 0},         {5, 1, true, 8, 8, 2}, {32, 1, true, 8, 8, 4},
               {32, 1, true, 8, 16, 2}, {7, 1, true, 8, 16, 4}};
  uint32_t seed = 900;
  for (const Case& c : cases) {
    const int64_t T = c.T, S = c.rows ? T : 1;  // S states
    const auto conv = randn(size_t(T * C), seed++), s0 = randn(size_t(S * Nv * Dk * Dv), seed++, 0.1f);
    const auto a = randn(size_t(T * Nv), seed++), b = randn(size_t(T * Nv), seed++),
               A = uniform(size_t(Nv), seed++, -2.f, -0.1f), dtb = randn(size_t(Nv), seed++);
    // Reference: split, l2-normalise, scale, gates, recurrence (per row with its own state when batched).
    std::vector<float> q(size_t(T * KD)), k(size_t(T * KD)), v(size_t(T * VD)), g(size_t(T * Nv)), beta(g.size()),
        want(size_t(T * VD)), st = s0;
    for (int64_t t = 0; t < T; ++t) {
      std::copy_n(conv.begin() + t * C, KD, q.begin() + t * KD);
      std::copy_n(conv.begin() + t * C + KD, KD, k.begin() + t * KD);
      std::copy_n(conv.begin() + t * C + 2 * KD, VD, v.begin() + t * VD);
    }
    const float qs = ref_delta_inputs(q, k, a, b, A, dtb, T, Nk, Nv, Dk, g, beta);
    if (c.rows) {
      for (int64_t m = 0; m < T; ++m)
        ref::gdn_recurrent(st.data() + m * Nv * Dk * Dv, q.data() + m * KD, k.data() + m * KD, v.data() + m * VD,
                           g.data() + m * Nv, beta.data() + m * Nv, 1, Nk, Nv, Dk, Dv, want.data() + m * VD);
    } else {
      ref::gdn_recurrent(st.data(), q.data(), k.data(), v.data(), g.data(), beta.data(), T, Nk, Nv, Dk, Dv,
                         want.data());
    }
    struct Run {
      std::vector<float> out, state, beta;
      int64_t kernels;
    };
    auto run = [&](bool fuse, int rows_split) {
      CudaBackend::Options o;
      o.fuse = fuse;
      o.delta = c.mode;
      o.delta_step = c.step_warps;
      o.delta_rows = c.rows_warps;
      o.delta_rows_split = rows_split;
      o.graphs = false;
      CudaBackend be(o);
      Buffer dconv = up(be, conv), ds = up(be, s0), da = up(be, a), db = up(be, b), dA = up(be, A), dd = up(be, dtb),
             dq = poisoned(be, q.size()), dk = poisoned(be, k.size()), dv = poisoned(be, v.size()),
             dg = poisoned(be, g.size()), dbeta = poisoned(be, g.size()), out = poisoned(be, want.size());
      std::vector<float*> states(static_cast<size_t>(S), nullptr);
      for (int64_t m = 0; m < S; ++m) states[size_t(m)] = ds.data() + m * Nv * Dk * Dv;
      const int64_t k0 = be.stats().kernels;
      be.copy_rows(dq.data(), KD, dconv.data(), C, T, KD);
      be.copy_rows(dk.data(), KD, dconv.data() + KD, C, T, KD);
      be.copy_rows(dv.data(), VD, dconv.data() + 2 * KD, C, T, VD);
      be.l2norm_heads(dq.data(), T * Nk, Dk, 1e-6f);
      be.l2norm_heads(dk.data(), T * Nk, Dk, 1e-6f);
      be.scale(dq.data(), size_t(T * KD), qs);
      be.gdn_gates(da.data(), db.data(), dA.data(), dd.data(), T, Nv, dg.data(), dbeta.data());
      if (c.rows)
        be.gdn_delta_rule_rows(states.data(), dq.data(), dk.data(), dv.data(), dg.data(), dbeta.data(), T, Nk, Nv, Dk,
                               Dv, out.data());
      else
        be.gdn_delta_rule(ds.data(), dq.data(), dk.data(), dv.data(), dg.data(), dbeta.data(), T, Nk, Nv, Dk, Dv,
                          out.data());
      Run r{down(be, out), down(be, ds), down(be, dbeta), 0};
      r.kernels = be.stats().kernels - k0;
      return r;
    };
    int64_t kernels[2] = {0, 0};
    for (bool fuse : {true, false}) {
      const Run r = run(fuse, c.rows_split);
      kernels[fuse ? 0 : 1] = r.kernels;
      const std::string what = "T " + std::to_string(T) + " delta " + std::to_string(c.mode) +
                               (c.rows ? " rows" : " one sequence") + (fuse ? " fused" : " unfused") + " step warps " +
                               std::to_string(c.step_warps) + " rows warps " + std::to_string(c.rows_warps) +
                               " split " + std::to_string(c.rows_split);
      EXPECT_LE(rel_err(r.out, want), 5e-5) << what;
      EXPECT_LE(rel_err(r.state, st), 5e-5) << what;
      EXPECT_LE(rel_err(r.beta, beta), 1e-5) << what;
      if (c.rows_split > 1) {
        // Column slices change only which block computes a column: outputs and states bit-identical to one block per
        // state (round 22).
        const Run one = run(fuse, 1);
        EXPECT_EQ(one.out, r.out) << what << ": outputs against split 1";
        EXPECT_EQ(one.state, r.state) << what << ": states against split 1";
      }
    }
    EXPECT_LE(kernels[0] + 3, kernels[1]) << "T " << T << ": fused " << kernels[0] << " vs unfused " << kernels[1]
                                          << " launches (the three copies should fold into the delta rule)";
  }
}

// Backend::attention_prep (the q / gate split, q and k head norms, RoPE, KV append) in one launch (attn_prep.cu)
// against the op sequence on the reference backend and on the CUDA backend with fusion off: one sequence (chunk at
// p0, incl. a position past 2^17 where an fp32 angle would be off) and batched rows with their own positions and
// caches. Whole caches compared: rows that must not be written keep their (random) contents.
TEST(CudaOps, AttentionPrepMatchesTheOpSequence) {
  BONSAI_REQUIRE_GPU();
  struct Case {
    int64_t M, H, Hkv, Dh, rot, p0;
    bool rows;
  } cases[] = {{1, 24, 4, 256, 64, 7, false},  {5, 24, 4, 256, 64, 200000, false}, {70, 6, 2, 64, 64, 3, false},
               {3, 4, 2, 12, 8, 1, false},     {5, 24, 4, 256, 64, 0, true},        {32, 6, 2, 64, 32, 0, true}};
  uint32_t seed = 1300;
  for (const Case& c : cases) {
    const int64_t row = c.Hkv * c.Dh, cap = c.rows ? 40 : c.p0 + c.M + 2, S = c.rows ? c.M : 1;
    const auto qg = randn(size_t(c.M * c.H * 2 * c.Dh), seed++), k = randn(size_t(c.M * row), seed++),
               v = randn(size_t(c.M * row), seed++), qn = uniform(size_t(c.Dh), seed++, 0.5f, 1.5f),
               kn = uniform(size_t(c.Dh), seed++, 0.5f, 1.5f), cache0 = randn(size_t(S * cap * row), seed++);
    std::vector<int64_t> pos(size_t(c.M));
    for (int64_t m = 0; m < c.M; ++m) pos[size_t(m)] = c.rows ? (m * 7 + 3) % cap : c.p0 + m;
    auto run = [&](Backend& be, bool host) {
      // Returns q, gate, K caches, V caches (host copies).
      std::vector<float> hq(size_t(c.M * c.H * c.Dh), NAN), hgate(hq.size(), NAN), hk = k, hkc = cache0, hvc = cache0;
      // The gains too: outside a prepared model, a backend op's constants live in its own memory.
      Buffer dqg = up(be, qg), dq = poisoned(be, hq.size()), dgate = poisoned(be, hq.size()), dk = up(be, k),
             dv = up(be, v), dkc = up(be, cache0), dvc = up(be, cache0), dqn = up(be, qn), dkn = up(be, kn);
      AttnPrep a{host ? qg.data() : dqg.data(),
                 host ? hq.data() : dq.data(),
                 host ? hgate.data() : dgate.data(),
                 host ? hk.data() : dk.data(),
                 host ? v.data() : dv.data(),
                 host ? qn.data() : dqn.data(),
                 host ? kn.data() : dkn.data(),
                 c.M,
                 c.H,
                 c.Hkv,
                 c.Dh,
                 c.rot,
                 1e-6f,
                 10000000.f};
      float* kc_base = host ? hkc.data() : dkc.data();
      float* vc_base = host ? hvc.data() : dvc.data();
      std::vector<float*> kcs(size_t(c.M)), vcs(size_t(c.M));
      if (c.rows) {
        for (int64_t m = 0; m < c.M; ++m) {
          kcs[size_t(m)] = kc_base + m * cap * row;
          vcs[size_t(m)] = vc_base + m * cap * row;
        }
        a.pos = pos.data();
        a.k_caches = kcs.data();
        a.v_caches = vcs.data();
      } else {
        a.p0 = c.p0;
        a.k_cache = kc_base;
        a.v_cache = vc_base;
      }
      be.attention_prep(a);
      if (host) return std::vector<std::vector<float>>{hq, hgate, hkc, hvc};
      return std::vector<std::vector<float>>{down(be, dq), down(be, dgate), down(be, dkc), down(be, dvc)};
    };
    RefBackend ref;
    const auto want = run(ref, true);
    CudaBackend::Options unfused;
    unfused.fuse = false;
    CudaBackend fused_be, unfused_be(unfused);
    const auto got = run(fused_be, false), seq = run(unfused_be, false);
    const char* names[4] = {"q", "gate", "K cache", "V cache"};
    for (int i = 0; i < 4; ++i) {
      const std::string what = std::string(names[i]) + ", M " + std::to_string(c.M) + " Dh " + std::to_string(c.Dh) +
                               " p0 " + std::to_string(c.p0) + (c.rows ? " rows" : "");
      EXPECT_LE(rel_err(got[size_t(i)], want[size_t(i)]), 2e-6) << what << " (fused vs reference)";
      EXPECT_LE(rel_err(got[size_t(i)], seq[size_t(i)]), 2e-6) << what << " (fused vs the CUDA op sequence)";
    }
  }
}

TEST(CudaOps, EmbeddingGatherAndInverseTransform) {
  BONSAI_REQUIRE_GPU();
  CudaBackend& be = gpu();
  const int64_t V = 301, E = 2048;
  TernaryMatrix& table = random_matrix(V, E, 77, 0.01);
  be.prepare_matrix(table);
  const auto s = random_signs(size_t(E), 3);
  Buffer sd = up_bytes(be, s);
  for (int64_t M : {1, 3, 70}) {
    std::vector<int32_t> ids(static_cast<size_t>(M));
    for (int64_t m = 0; m < M; ++m) ids[size_t(m)] = int32_t((m * 97 + 5) % V);
    ids[0] = int32_t(V - 1);
    std::vector<float> want(size_t(M * E));
    for (int64_t m = 0; m < M; ++m)
      ref::ternary_dequant_row(table.blocks, E, ids[size_t(m)], want.data() + m * E);
    Buffer o = poisoned(be, want.size());
    be.embed_rows(table, ids.data(), M, o.data());
    EXPECT_EQ(down(be, o), want) << "M " << M;
    ref::hadamard_inverse(want.data(), M, E, s.data(), 1024);
    be.hadamard_inverse(o.data(), M, E, reinterpret_cast<const int8_t*>(sd.data()), 1024);
    EXPECT_LE(rel_err(down(be, o), want), 1e-5) << "M " << M;
  }
}

// Per-row argmax for greedy decode: rows with ties (across the blocks of a row's chunks), NaN, +inf and all-NaN, vs
// ref::argmax per row. Row counts give 64 chunks per row (one 248,320-entry row: batch 1), 25 (5 rows), 6 (40 rows)
// and 1 (a short row); each shape twice (the split counters must be left at zero).
TEST(CudaOps, DeviceArgmaxRows) {
  BONSAI_REQUIRE_GPU();
  CudaBackend& be = gpu();
  struct Case {
    int64_t rows, n;
  } cases[] = {{1, 248320}, {5, 100003}, {40, 30011}, {3, 1000}};
  uint32_t seed = 2;
  for (const Case& c : cases) {
    const int64_t rows = c.rows, n = c.n;
    auto x = randn(size_t(rows * n), seed++);
    x[size_t((rows - 1) * n + n - 3)] = 40.f;  // the last chunk's tie partner
    x[size_t((rows - 1) * n + 9)] = 40.f;      // tie across chunks: lowest index wins
    if (rows > 2) {
      x[size_t(1 * n + 3)] = std::numeric_limits<float>::quiet_NaN();
      x[size_t(1 * n + 4)] = std::numeric_limits<float>::infinity();
      std::fill(x.begin() + 2 * n, x.begin() + 3 * n, std::numeric_limits<float>::quiet_NaN());  // all NaN: 0
    }
    Buffer d = up(be, x);
    for (int rep = 0; rep < 2; ++rep) {
      std::vector<int32_t> got(static_cast<size_t>(rows), -7);
      ASSERT_TRUE(be.argmax_rows(d.data(), rows, n, got.data()));
      for (int64_t r = 0; r < rows; ++r)
        EXPECT_EQ(int64_t(got[size_t(r)]), ref::argmax(x.data() + r * n, n)) << "rows " << rows << " row " << r << " rep " << rep;
    }
  }
}

TEST(CudaOps, DeviceArgmax) {
  BONSAI_REQUIRE_GPU();
  CudaBackend& be = gpu();
  auto x = randn(248320, 1);
  auto check = [&](const char* what) {
    Buffer d = up(be, x);
    EXPECT_EQ(be.argmax(d.data(), int64_t(x.size())), ref::argmax(x.data(), int64_t(x.size()))) << what;
  };
  check("random");
  x[200000] = 50.f;
  x[100] = 50.f;  // tie: lowest index wins
  check("tie");
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x[6] = std::numeric_limits<float>::infinity();
  check("nan + inf");
  std::fill(x.begin(), x.end(), std::numeric_limits<float>::quiet_NaN());
  check("all nan");
}

// The decode-step L2 prefetch is a patch of a recorded matvec launch's arguments (host only, no device):
// it applies to M = 1 matvecs only, is idempotent (a replayed step compares equal to the cached graph
// node), refuses more bytes than the cap, and leaves a refused launch unchanged.
TEST(CudaOps, MatvecPrefetchPatchesOnlyM1Matvecs) {
  const auto* words = reinterpret_cast<const uint32_t*>(uintptr_t(1) << 20);
  const auto* scales = reinterpret_cast<const uint16_t*>(uintptr_t(1) << 24);
  auto* y = reinterpret_cast<float*>(uintptr_t(1) << 28);
  const cuda::TernaryDev cur{words, scales, y, 4096};
  const cuda::TernaryDev next[2] = {{words, scales, y, 1000}, {words, scales, y, 24}};
  const int64_t K = 5120;
  const uint64_t next_bytes = uint64_t(1024 * K / 4 + 1024 * K / 64);  // words + scales of both outputs
  for (int levels : {1, 2}) {
    const cuda::Launch m1 = cuda::matvec_launch(&cur, 1, K, nullptr, nullptr, 1, levels, 132, 4);
    cuda::Launch l = m1;
    EXPECT_FALSE(cuda::matvec_set_prefetch(l, next, 2, K, next_bytes - 1));  // over the cap
    EXPECT_TRUE(l.same_args(m1));
    EXPECT_TRUE(cuda::matvec_set_prefetch(l, next, 2, K, next_bytes));
    EXPECT_TRUE(l.same_shape(m1));
    EXPECT_FALSE(l.same_args(m1));
    cuda::Launch again = l;
    EXPECT_TRUE(cuda::matvec_set_prefetch(again, next, 2, K, next_bytes));
    EXPECT_TRUE(again.same_args(l));
    // M = 2: a matvec with two tokens per pass, not a decode step's M = 1 launch
    const cuda::Launch m2 = cuda::matvec_launch(&cur, 1, K, nullptr, nullptr, 2, levels, 132, 4);
    l = m2;
    EXPECT_FALSE(cuda::matvec_set_prefetch(l, next, 2, K, next_bytes));
    EXPECT_TRUE(l.same_args(m2));
  }
  // the balanced grid: one block per resident slot (2 per SM), fewer when there are fewer row groups
  EXPECT_EQ(cuda::matvec_launch(&cur, 1, K, nullptr, nullptr, 1, 2, 132, 4).grid.x, 264u);
  const cuda::TernaryDev small{words, scales, y, 37};  // 10 groups of 4 rows
  EXPECT_EQ(cuda::matvec_launch(&small, 1, K, nullptr, nullptr, 1, 2, 132, 4).grid.x, 10u);
}

TEST(CudaOps, ShapeMisuseThrows) {
  BONSAI_REQUIRE_GPU();
  CudaBackend& be = gpu();
  Buffer x(be, 4096);
  EXPECT_THROW(be.hadamard_forward(x.data(), 1, 3000, nullptr, 1024), Error);
  EXPECT_THROW(be.hadamard_forward(x.data(), 1, 96, nullptr, 24), Error);
  EXPECT_THROW(be.attention(x.data(), x.data(), x.data(), 1, 0, 12, 5, 64, 1.f, x.data()), Error);
  TernaryMatrix unprepared;
  unprepared.name = "not.uploaded";
  unprepared.rows = 1;
  unprepared.cols = 128;
  const LinearOut o{&unprepared, x.data()};
  EXPECT_THROW(be.linear(&o, 1, 128, x.data(), 1), Error);
  be.synchronize();
}

}  // namespace
}  // namespace bonsai
