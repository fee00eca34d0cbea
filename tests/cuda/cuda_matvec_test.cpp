// Matvec v6 (matvec_mma.cu, the tensor-core decode matvec): against the exact result of the int8 arithmetic
// (quantised_reference), against v3 (the dp4a matvec it replaces), and run to run, at awkward shapes: M = 1..4,
// q8 and q16, K a multiple of 128 but not of 256 (a last step with one group), N not a multiple of 16 (a
// ragged last tile), up to 4 outputs in one launch (tiles of several outputs in one block), few tiles with a
// long K (tiles cut between many warps: the shared-memory sum) and many tiles per block; every block shape,
// the lockstep ones (cfg 5-7: the block's warps share each tile) with K = 128 / 384 (one / two warps per block),
// steps that do not divide evenly over the warps and several batches of tiles per block. Then the batched-decode
// kernel (matvec_mma_batch.cu, M up to 32), and v6's split-K (round 9c).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "cuda_test_util.h"

namespace bonsai {
namespace {

using namespace cudatest;

struct Case {
  int64_t M, K;
  std::vector<int64_t> N;
};

std::vector<float> run_linear(CudaBackend& b, const std::vector<TernaryMatrix*>& ws, const std::vector<float>& x,
                              int64_t M, int64_t K, std::vector<std::vector<float>>& per_out) {
  for (TernaryMatrix* w : ws) b.prepare_matrix(*w);
  Buffer dx = up(b, x);
  std::vector<Buffer> ys;
  std::vector<LinearOut> outs;
  for (TernaryMatrix* w : ws) {
    ys.push_back(poisoned(b, size_t(M * w->rows)));
    outs.push_back({w, ys.back().data()});
  }
  b.linear(outs.data(), int(outs.size()), K, dx.data(), M);
  std::vector<float> all;
  per_out.clear();
  for (Buffer& y : ys) {
    per_out.push_back(down(b, y));
    all.insert(all.end(), per_out.back().begin(), per_out.back().end());
  }
  EXPECT_EQ(down(b, dx), x);  // x itself untouched
  return all;
}

// Every case at every level v6 serves and every block shape of `cfgs`: against the exact int8 arithmetic, against v3,
// and run to run EQUAL.
// v7_first: CudaBackend::Options::matvec7_first (the rows of a v7 block's first stage).
void v6_cases(const std::vector<Case>& cases, uint32_t seed, const std::vector<int>& cfgs, int v7_first = -1) {
  for (const Case& c : cases) {
    std::vector<TernaryMatrix*> ws;
    for (int64_t N : c.N) ws.push_back(&random_matrix(N, c.K, seed++, 0.02));
    const auto x = randn(size_t(c.M * c.K), seed++);
    for (int levels : {2, 1}) {
      if (!cuda::matvec6_supported(c.M, levels, c.K)) continue;
      std::vector<std::vector<float>> exact;
      for (TernaryMatrix* w : ws) exact.push_back(quantised_reference(*w, x, c.M, levels));
      CudaBackend::Options o3;
      o3.graphs = false;
      o3.act_levels = levels;
      o3.matvec = 3;
      o3.tensor_cores = false;  // v3 at every M (q16 M > 2 would go to the GEMM)
      CudaBackend b3(o3);
      std::vector<std::vector<float>> v3_out;
      const std::vector<float> v3 = run_linear(b3, ws, x, c.M, c.K, v3_out);
      for (int cfg : cfgs) {
        CudaBackend::Options o6 = o3;
        o6.tensor_cores = true;
        o6.matvec = 6;
        o6.matvec6_cfg = cfg;
        o6.matvec7_first = v7_first;
        CudaBackend b6(o6);
        std::vector<std::vector<float>> got;
        const std::vector<float> v6 = run_linear(b6, ws, x, c.M, c.K, got);
        std::string shape = "M " + std::to_string(c.M) + " K " + std::to_string(c.K) + " N";
        for (int64_t N : c.N) shape += " " + std::to_string(N);
        const std::string what = shape + (levels == 2 ? " q16" : " q8") + " cfg " + std::to_string(cfg);
        for (size_t i = 0; i < ws.size(); ++i) EXPECT_LE(rel_err(got[i], exact[i]), 1e-5) << what << " output " << i;
        // v6 sums per 128-group, v3 per 64-chunk, in other orders: fp32 rounding apart, nothing more.
        EXPECT_LE(rel_err(v6, v3), 1e-5) << what << " vs v3";
        // Deterministic: the cut tiles are summed in warp order, not in arrival order.
        std::vector<std::vector<float>> again_out;
        const std::vector<float> again = run_linear(b6, ws, x, c.M, c.K, again_out);
        EXPECT_EQ(again, v6) << what << " run to run";
      }
    }
  }
}

TEST(CudaMatvec6, MatchesTheQuantisedReferenceAndV3) {
  BONSAI_REQUIRE_GPU();
  v6_cases({{1, 128, {1}},          {1, 384, {37}},          {2, 640, {129}},
            {1, 1152, {300, 129, 7}}, {2, 1152, {65, 31}},   {2, 384, {5, 3, 17, 2}},
            {3, 1152, {65, 31}},    {4, 256, {17}},          {4, 640, {300}},
            {1, 5120, {1024}},      {2, 17408, {70}},        {1, 6144, {515}},
            {1, 5120, {20003}},     {1, 1024, {3000, 1000, 24}},
            {1, 17408, {37, 5}},    {1, 6144, {3000}},       {2, 5120, {17, 1}}},
           700, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14});  // 8-10: v7 (auto / 16 / 32-row stages), 11-13: on k16
}

// v7 (cfg 8-10: the bulk-copy ring) on a few small shapes, for compute-sanitizer memcheck: ragged last tiles whose
// scales are not a multiple of 16 bytes (the warp copies them), an odd number of groups, several outputs, q8 M 4.
// Round 15: 8-10 run the m16n8k32 step (activations in pair order: converted in registers where one step per warp
// reads them from global memory, K 5120 / 640; permuted by the staging copy otherwise), 11-13 round 14's k16 step.
TEST(CudaMatvec6, V7Small) {
  BONSAI_REQUIRE_GPU();
  const std::vector<Case> small = {{1, 640, {5, 129}}, {2, 1152, {37}}, {4, 384, {17, 3}}, {1, 17408, {20}},
                                   {2, 5120, {100}}, {1, 5120, {77}}};
  v6_cases(small, 1500, {8, 9, 10, 11, 12, 13});
  // Round 15: the first stage whole (the ragged one last, round 14's order) and of 8 rows.
  v6_cases(small, 1600, {8, 10}, 0);
  v6_cases(small, 1700, {8, 10}, 8);
}

// The two steps are the same integer sums grouped differently: the k32 instances must give the k16 ones' outputs
// bit for bit (one step per warp from global memory, K = 5120; staged pairs, K = 6144 and 17,408; q8 too).
TEST(CudaMatvec6, V7K32EqualsK16) {
  BONSAI_REQUIRE_GPU();
  const std::vector<Case> cases = {{1, 5120, {1024, 300}}, {2, 5120, {700}}, {1, 6144, {515}}, {1, 17408, {600}},
                                   {4, 5120, {333}}, {1, 17408, {129, 3}}};
  uint32_t seed = 4242;
  for (const Case& c : cases) {
    std::vector<TernaryMatrix*> ws;
    for (int64_t N : c.N) ws.push_back(&random_matrix(N, c.K, seed++, 0.02));
    const auto x = randn(size_t(c.M * c.K), seed++);
    for (int levels : {2, 1}) {
      if (!cuda::matvec6_supported(c.M, levels, c.K)) continue;
      std::vector<float> y[2];
      for (int k16 : {0, 1}) {
        CudaBackend::Options o;
        o.graphs = false;
        o.act_levels = levels;
        o.matvec = 6;
        o.matvec6_cfg = k16 ? 11 : 8;
        CudaBackend b(o);
        std::vector<std::vector<float>> per_out;
        y[k16] = run_linear(b, ws, x, c.M, c.K, per_out);
      }
      EXPECT_EQ(y[0], y[1]) << "M " << c.M << " K " << c.K << (levels == 2 ? " q16" : " q8");
    }
  }
}

// Round 11: the one-row site as the prologue of matvec v7 (Options::site_prologue; warp_site.cuh). The backend defers
// the site and the v7 product computes it. Against the same backend with the switch off (the site kernel then v7):
// the elementwise pre-ops (silu * up, x * sigmoid(g), plain rotate) give the site kernel's int8 digits bit for bit,
// so the outputs are EQUAL; the norms (gated, add + rms, rms) sum their squares in another order (<= 1e-4
// relative). AddNorm: h += delta is the same float add (h EQUAL after every step), the normed row within 1e-5; three
// steps in a row (the counters must come back to zero: a stale arrival count would let a block write h before
// another has read it). n 1024 (the packs' block: both shared-memory stages) / 512 (one) / 128 / 1; K 5120 (one round of
// 5 four-warp groups, AddNorm keeps its loads in registers), 6144 (2 rounds of 3 groups), 17,408 (ffn_down: 5 rounds of
// 4 groups, AddNorm reloads), 3072; two outputs; K = 640 and 1536 (not multiples of 1024: the site kernel runs first)
// must still be right.
TEST(CudaMatvec7, SitePrologueMatchesTheSiteKernel) {
  BONSAI_REQUIRE_GPU();
  struct Shape {
    int64_t K, n;
    std::vector<int> kinds;
  };
  const std::vector<Shape> shapes = {{5120, 1024, {0, 1, 2, 3, 4, 5}}, {3072, 128, {0, 2, 3, 4}}, {3072, 512, {0, 4}},
                                     {3072, 1, {3, 5}}, {6144, 1024, {1, 2}}, {17408, 1024, {0, 4}}, {640, 128, {0, 4}},
                                     {1536, 512, {4}}};
  uint32_t seed = 1700;
  for (const int levels : {2, 1}) {
    CudaBackend::Options on, off;
    on.site_prologue = 1;
    off.site_prologue = 0;
    on.act_levels = off.act_levels = levels;
    CudaBackend fused(on), plain(off);
    for (const Shape& sh : shapes) {
      const int64_t K = sh.K, Dv = 128;
      TernaryMatrix& w0 = random_matrix(700, K, seed++, 0.02);
      TernaryMatrix& w1 = random_matrix(129, K, seed++, 0.02);
      const auto a = randn(size_t(K), seed++), b = randn(size_t(K), seed++), h0 = randn(size_t(K), seed++, 3.f);
      const auto gain = uniform(size_t(K), seed++, 0.5f, 1.5f);
      const auto s = random_signs(size_t(K), seed++);
      for (const int kind : sh.kinds) {  // silu*up, x*sigmoid(g), gated norm, plain, add + rmsnorm, rmsnorm
        const int steps = kind == 4 ? 3 : 1;
        std::vector<float> y[2], h[2], xn[2];
        for (CudaBackend* be : {&fused, &plain}) {
          be->prepare_matrix(w0);
          be->prepare_matrix(w1);
          Buffer sd = up_bytes(*be, s), gd = up(*be, gain), hd = up(*be, h0);
          Buffer da = up(*be, a), db = up(*be, b), site = poisoned(*be, size_t(K)), xd = poisoned(*be, size_t(K));
          Buffer y0 = poisoned(*be, size_t(w0.rows)), y1 = poisoned(*be, size_t(w1.rows));
          const auto* signs = reinterpret_cast<const int8_t*>(sd.data());
          const LinearOut outs[2] = {{&w0, y0.data()}, {&w1, y1.data()}};
          std::vector<float>& ys = y[be == &plain];
          for (int step = 0; step < steps; ++step) {
            if (kind == 0) be->silu_mul_rotate(da.data(), db.data(), 1, K, site.data(), signs, sh.n);
            if (kind == 1 || kind == 2 || kind == 3) {
              if (kind == 1) be->sigmoid_gate_mul(da.data(), db.data(), K);
              if (kind == 2) be->gated_rmsnorm(da.data(), db.data(), gd.data(), K / Dv, Dv, 1e-6f, da.data());
              be->copy_rows(site.data(), K, da.data(), K, 1, K);
              be->hadamard_forward(site.data(), 1, K, signs, sh.n);
            }
            if (kind == 4 || kind == 5)
              be->add_rmsnorm_rotate(hd.data(), kind == 4 ? da.data() : nullptr, 1, K, gd.data(), 1e-6f, xd.data(),
                                     site.data(), signs, sh.n);
            be->linear(outs, 2, K, site.data(), 1);
            auto v0 = down(*be, y0), v1 = down(*be, y1);
            ys.insert(ys.end(), v0.begin(), v0.end());
            ys.insert(ys.end(), v1.begin(), v1.end());
            if (kind >= 4) {  // the residual after the step and the normed row
              const auto hv = down(*be, hd), xv = down(*be, xd);
              h[be == &plain].insert(h[be == &plain].end(), hv.begin(), hv.end());
              xn[be == &plain].insert(xn[be == &plain].end(), xv.begin(), xv.end());
            }
          }
        }
        const std::string what = (levels == 2 ? "q16" : "q8") + std::string(" K ") + std::to_string(K) + " n " +
                                 std::to_string(sh.n) + " kind " + std::to_string(kind);
        for (float v : y[0]) ASSERT_TRUE(std::isfinite(v)) << what;  // poison: every output written
        ASSERT_EQ(y[0].size(), y[1].size()) << what;
        if (kind == 2 || kind >= 4) EXPECT_LE(rel_err(y[0], y[1]), 1e-4) << what;
        else EXPECT_EQ(y[0], y[1]) << what;
        if (kind >= 4) {
          EXPECT_EQ(h[0], h[1]) << what << ": the residual";
          EXPECT_LE(rel_err(xn[0], xn[1]), 1e-5) << what << ": the normed row";
        }
      }
    }
  }
}

// Split-K v6 (Options::matvec6_split, round 9c): K cut into S slices that are tiles of their own, each slice's
// partial y summed in slice order by the last block to finish the row tile (an arrival counter per row tile that
// the launch leaves at zero). Against the exact int8 arithmetic, and run to run EQUAL (the second and third runs
// also prove the counters were reset: a stale count would leave the poisoned output unwritten). K from
// ffn_down's 17,408 down to 640 (5 groups: no S <= 4 divides it, so the unsplit kernel runs), N ragged (37, 1000)
// and 5,120, M 1 and 2 (q16) up to 4 (q8), S 2..4 where K % (128 S) == 0, the automatic S (1), the lockstep shapes
// 0 (16-row tiles at K > 8,192, else 32), 5 (4 steps in flight) and 6 (32-row tiles: other row tiles), and both tile
// orders (row tile major: a row tile's slices in one block or two; slice major).
void split_k_cases(const std::vector<Case>& cases, uint32_t seed) {
  for (const Case& c : cases) {
    TernaryMatrix& w = random_matrix(c.N[0], c.K, seed++, 0.02);
    const auto x = randn(size_t(c.M * c.K), seed++);
    for (int levels : {2, 1}) {
      if (!cuda::matvec6_supported(c.M, levels, c.K)) continue;
      const std::vector<float> exact = quantised_reference(w, x, c.M, levels);
      for (int split : {1, 2, 3, 4}) {
        for (int cfg : {0, 5, 6})
        for (bool ilv : {true, false}) {
          if (!ilv && split == 1) continue;
          CudaBackend::Options o;
          o.graphs = false;
          o.act_levels = levels;
          o.matvec = 6;
          o.matvec6_cfg = cfg;
          o.matvec6_split = split;
          o.matvec6_split_any = true;  // the small K too
          o.matvec6_split_ilv = ilv;
          CudaBackend b(o);
          std::vector<std::vector<float>> got;
          const std::vector<float> y = run_linear(b, {&w}, x, c.M, c.K, got);
          const std::string what = "M " + std::to_string(c.M) + " K " + std::to_string(c.K) + " N " +
                                   std::to_string(c.N[0]) + (levels == 2 ? " q16" : " q8") + " split " +
                                   std::to_string(split) + " cfg " + std::to_string(cfg) + (ilv ? "" : " slice major");
          EXPECT_LE(rel_err(y, exact), 1e-5) << what;
          for (int rep = 0; rep < 2; ++rep) {
            std::vector<std::vector<float>> again_out;
            EXPECT_EQ(run_linear(b, {&w}, x, c.M, c.K, again_out), y) << what << " run to run " << rep;
          }
        }
      }
    }
  }
}

TEST(CudaMatvec6, SplitKMatchesTheQuantisedReference) {
  BONSAI_REQUIRE_GPU();
  split_k_cases({{1, 6144, {5120}}, {2, 5120, {5120}}, {1, 1152, {1000}}, {2, 640, {37}}, {1, 17408, {37}},
                 {2, 17408, {1000}}, {1, 5120, {37}}, {2, 6144, {1000}}, {4, 6144, {37}}, {1, 640, {1000}},
                 {3, 1152, {5120}}},
                1300);
}

// A few small shapes for compute-sanitizer memcheck (every split, shape and level still).
TEST(CudaMatvec6, SplitKSmall) {
  BONSAI_REQUIRE_GPU();
  split_k_cases({{2, 1152, {37}}, {1, 6144, {100}}, {4, 5120, {37}}}, 1350);
}

// ffn_down's own shape (kept apart: its CPU reference is the slow part).
TEST(CudaMatvec6, SplitKFfnDown) {
  BONSAI_REQUIRE_GPU();
  split_k_cases({{1, 17408, {5120}}, {2, 17408, {5120}}}, 1400);
}

// The batched-decode kernel (matvec_mma_batch.cu): every M it serves, q16 and q8, odd N (ragged last row
// blocks), K from one group to ffn_down's 17,408 (K slices summed in shared memory when a block has few rows),
// 1-4 outputs per launch (row blocks of several outputs in one tile), many rows over a short K (several rounds of
// tiles per warp slot), both tile shapes (1 and 2 row blocks per warp) and the automatic one; against the exact
// int8 arithmetic and run to run. The kernel is forced (matvec_batch = 2) with v6 off, so M = 1, 2 run it too.
TEST(CudaMatvecBatch, MatchesTheQuantisedReference) {
  BONSAI_REQUIRE_GPU();
  const Case cases[] = {{3, 128, {1}},          {4, 640, {129}},        {5, 5120, {37}},
                        {7, 6144, {300, 17}},   {8, 5120, {515, 1000}}, {9, 640, {65, 31, 7}},
                        {16, 17408, {70}},      {17, 1152, {5, 3, 17, 2}}, {31, 5120, {129, 33}},
                        {32, 6144, {100}},      {32, 17408, {37}},      {1, 640, {300}},
                        {2, 5120, {77}},        {12, 384, {1001}},      {24, 256, {3000, 24}},
                        {6, 128, {45001}},      {32, 128, {20003}},     {13, 5120, {1024, 1024, 16, 48}}};
  uint32_t seed = 900;
  for (const Case& c : cases) {
    std::vector<TernaryMatrix*> ws;
    for (int64_t N : c.N) ws.push_back(&random_matrix(N, c.K, seed++, 0.02));
    const auto x = randn(size_t(c.M * c.K), seed++);
    for (int levels : {2, 1}) {
      if (!cuda::matvec_batch_supported(c.M, levels, c.K)) continue;
      std::vector<std::vector<float>> exact;
      for (TernaryMatrix* w : ws) exact.push_back(quantised_reference(*w, x, c.M, levels));
      for (int rb : {0, 1, 2}) {
        CudaBackend::Options o;
        o.graphs = false;
        o.act_levels = levels;
        o.matvec = 3;        // no v6 at M <= 2
        o.matvec_batch = 2;  // the batched kernel at every M
        o.matvec_batch_rb = rb;
        CudaBackend b(o);
        std::vector<std::vector<float>> got;
        const std::vector<float> all = run_linear(b, ws, x, c.M, c.K, got);
        std::string shape = "M " + std::to_string(c.M) + " K " + std::to_string(c.K) + " N";
        for (int64_t N : c.N) shape += " " + std::to_string(N);
        const std::string what = shape + (levels == 2 ? " q16" : " q8") + " rb " + std::to_string(rb);
        for (size_t i = 0; i < ws.size(); ++i) EXPECT_LE(rel_err(got[i], exact[i]), 1e-5) << what << " output " << i;
        // Deterministic: K slices are summed in slice order, never by atomics.
        std::vector<std::vector<float>> again_out;
        EXPECT_EQ(run_linear(b, ws, x, c.M, c.K, again_out), all) << what << " run to run";
      }
    }
  }
}

// The batched-decode wgmma kernel (matvec_wgmma_batch.cu, round 10), forced at every M (matvec_wgmma = 2, v6 off):
// M 1..32, q16 (N = 32 planes up to M 16, 64 above) and q8, against the exact int8 arithmetic and run to run EQUAL
// twice (the second and third runs also prove the launch left its counters at zero: a stale count would leave the
// poisoned output of a cut row block unwritten). Shapes that exercise the stream-K cut: few rows over a long K (one
// row block cut between up to 132 blocks: N 37 / 70 at K 17,408), row blocks of several outputs (4 outputs whose 64-row
// tiles share a 256-row block), ragged N (rows past N in a live tile), row blocks past the last tile, fewer units than
// SMs (K 128), and many row blocks per block.
void wgmma_cases(const std::vector<Case>& cases, uint32_t seed) {
  for (const Case& c : cases) {
    std::vector<TernaryMatrix*> ws;
    for (int64_t N : c.N) ws.push_back(&random_matrix(N, c.K, seed++, 0.02));
    const auto x = randn(size_t(c.M * c.K), seed++);
    for (int levels : {2, 1}) {
      if (!cuda::matvec_wgmma_supported(c.M, levels, c.K)) continue;
      std::vector<std::vector<float>> exact;
      for (TernaryMatrix* w : ws) exact.push_back(quantised_reference(*w, x, c.M, levels));
      CudaBackend::Options o;
      o.graphs = false;
      o.act_levels = levels;
      o.matvec = 3;        // no v6 at M <= 2
      o.matvec_wgmma = 2;  // the wgmma kernel at every M
      CudaBackend b(o);
      std::vector<std::vector<float>> got;
      const std::vector<float> all = run_linear(b, ws, x, c.M, c.K, got);
      std::string shape = "M " + std::to_string(c.M) + " K " + std::to_string(c.K) + " N";
      for (int64_t N : c.N) shape += " " + std::to_string(N);
      const std::string what = shape + (levels == 2 ? " q16" : " q8");
      for (size_t i = 0; i < ws.size(); ++i) EXPECT_LE(rel_err(got[i], exact[i]), 1e-5) << what << " output " << i;
      for (int rep = 0; rep < 2; ++rep) {  // cut row blocks are summed in block order, never by atomics
        std::vector<std::vector<float>> again_out;
        EXPECT_EQ(run_linear(b, ws, x, c.M, c.K, again_out), all) << what << " run to run " << rep;
      }
    }
  }
}

TEST(CudaMatvecBatch, WgmmaMatchesTheQuantisedReference) {
  BONSAI_REQUIRE_GPU();
  wgmma_cases({{1, 640, {300}},         {2, 5120, {77}},          {3, 128, {1}},
               {8, 5120, {515, 1000}},  {9, 640, {65, 31, 7}},    {12, 384, {1001}},
               {13, 5120, {1024, 1024, 16, 48}}, {16, 17408, {70}}, {17, 1152, {5, 3, 17, 2}},
               {24, 256, {3000, 24}},   {31, 5120, {129, 33}},    {32, 6144, {1300}},
               {32, 17408, {37}},       {32, 128, {20003}},       {32, 5120, {3000, 1000}},
               {20, 384, {45001}},      {27, 6144, {64, 192, 100}}},
              1500);
}

// A few small shapes for compute-sanitizer memcheck (a cut row block, several outputs, both plane counts, q8).
TEST(CudaMatvecBatch, WgmmaSmall) {
  BONSAI_REQUIRE_GPU();
  wgmma_cases({{32, 1152, {37}}, {9, 384, {300, 5}}, {16, 5120, {129}}}, 1550);
}

}  // namespace
}  // namespace bonsai
