// The CPU's tiled ternary layout (backend/cpu/tiles.h) and the kernels that read it.
// - build_tiles: every code and d of the canonical matrix (through a row map) is where the layout says,
//   read back by this test's own scalar decoder; padding rows are zero.
// - the tiled integer kernels of each variant that has them, at odd shapes (N = 37: a partial last tile;
//   odd G: the tail chunk) and M = 1, 5, 64, 67, levels 1-3, over a tile sub-range (t0 > 0):
//     even G: bit-identical to the canonical GEMM (ternary_rows_q8_xm, also at M = 1), the stated contract;
//     odd G: within 1e-5 of the reference fed the dequantised activation (exact integer dots + fp32);
//     outputs outside the tile range untouched.
// - the op layer with tiles: the same bits as without at even G, for 1-3 threads, and a mix of tiled and
//   untiled weight sets falls back to the canonical kernels.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/cpu/act_q8.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/tiles.h"
#include "backend/ref/ops.h"
#include "forced_kernels.h"
#include "op_test_util.h"

using namespace bonsai;
using namespace bonsai::test;

namespace {

// Not cpu::make_tiled_copy: this buffer starts as 0xA5 so that a byte build_tiles leaves unwritten shows.
struct TiledBuf {
  std::vector<uint8_t> raw;
  uint8_t* p;
};
TiledBuf make_tiles(const uint8_t* blocks, const RowRun* runs, int64_t n_runs, int64_t N, int64_t K) {
  TiledBuf t{std::vector<uint8_t>(cpu::tiled_bytes(N, K) + 64, 0xA5), nullptr};
  t.p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(t.raw.data()) + 63) & ~uintptr_t(63));
  cpu::build_tiles(blocks, runs, n_runs, N, K, t.p);
  return t;
}

// The layout of tiles.h, read back one element at a time.
int tiled_code(const uint8_t* tiles, int64_t K, int64_t r, int64_t e) {
  const int64_t G = K / 128, C = G / 2, g = e / 128, c = g / 2, h = g % 2, local = e % 128, p = local / 4;
  const uint8_t* chunk = tiles + (r / 16) * cpu::tile_bytes(K) + c * cpu::kTileChunkBytes;
  const int64_t k = (c < C ? 8 * h : 0) + p / 4;
  return (chunk[64 * k + 4 * (r % 16) + p % 4] >> (2 * (local % 4))) & 3;
}
uint16_t tiled_d(const uint8_t* tiles, int64_t K, int64_t r, int64_t g) {
  const int64_t G = K / 128, C = G / 2, c = g / 2;
  const uint8_t* chunk = tiles + (r / 16) * cpu::tile_bytes(K) + c * cpu::kTileChunkBytes;
  const uint8_t* d = chunk + (c < C ? 1024 + 32 * (g % 2) : 512) + 2 * (r % 16);
  return uint16_t(d[0] | (d[1] << 8));
}

TEST(CpuTiles, LayoutThroughARowMap) {
  for (auto [N, K] : {std::pair<int64_t, int64_t>{37, 384}, {16, 256}, {5, 128}, {40, 5120}}) {
    SCOPED_TRACE(testing::Message() << "N " << N << " K " << K);
    const auto W = random_ternary(N, K, 90 + uint32_t(N), 0.01);
    // Canonical row r is stored row (r + N/3) % N: two runs.
    const int64_t s = N / 3;
    const RowRun runs[2] = {{0, s, N - s}, {N - s, 0, s}};
    const auto t = make_tiles(W.blocks.data(), runs, s > 0 ? 2 : 0, N, K);
    const int64_t G = K / 128, rb = G * kPq2Bytes;
    for (int64_t r = 0; r < cpu::tile_count(N) * 16; ++r) {
      const int64_t stored = s > 0 ? (r < N - s ? r + s : r - (N - s)) : r;
      for (int64_t g = 0; g < G; ++g) {
        const uint8_t* blk = W.blocks.data() + stored * rb + g * kPq2Bytes;
        ASSERT_EQ(tiled_d(t.p, K, r, g), r < N ? pq2_block_scale(blk) : 0) << "row " << r << " group " << g;
        for (int64_t e = 128 * g; e < 128 * g + 128; ++e)
          ASSERT_EQ(tiled_code(t.p, K, r, e), r < N ? pq2_block_code(blk, int(e % 128)) : 0)
              << "row " << r << " element " << e;
      }
    }
    // The tail chunk's 32 pad bytes are written (zero), not left as the buffer's 0xA5.
    if (G & 1)
      for (int64_t i = 0; i < 32; ++i)
        ASSERT_EQ(t.p[cpu::tile_bytes(K) - 32 + i], 0);
  }
}

class TiledKernels : public ForcedKernels {};

class TiledSimd : public ForcedKernels {};  // the variants with tiled kernels

TEST_P(TiledSimd, AgainstTheCanonicalGemm) {
  const cpu::Kernels& k = cpu::kernels();
  ASSERT_TRUE(k.ternary_tiles_q8_x1 && k.ternary_tiles_q8_xm) << GetParam() << " lost its tiled kernels";
  for (int levels : {1, 2, 3})
    for (auto [N, K] : {std::pair<int64_t, int64_t>{37, 384}, {37, 128}, {37, 256}, {9, 1152}, {40, 5120}, {5, 17408}}) {
      const auto W = random_ternary(N, K, 100 + uint32_t(K), 0.002);
      const auto t = make_tiles(W.blocks.data(), nullptr, 0, N, K);
      const int64_t G = K / 128, T = cpu::tile_count(N), t0 = T > 1 ? 1 : 0;
      for (int64_t M : {1, 5, 64, 67}) {
        SCOPED_TRACE(testing::Message() << GetParam() << " levels " << levels << " N " << N << " K " << K << " M " << M);
        const auto x = randn(size_t(M * K), 101 + uint32_t(M));
        const cpu::ActQ8 xq = cpu::quantize_activation(x.data(), M, K, levels);
        std::vector<float> canon = poisoned(size_t(M * N));
        k.ternary_rows_q8_xm(W.blocks.data(), K, 0, N, xq.q, xq.scale, xq.sum, levels, M, canon.data(), N);
        auto got = poisoned(size_t(M * N));
        if (M == 1) k.ternary_tiles_q8_x1(t.p, K, N, t0, T, xq.q, xq.scale, xq.sum, levels, got.data());
        else k.ternary_tiles_q8_xm(t.p, K, N, t0, T, xq.q, xq.scale, xq.sum, levels, M, got.data(), N);
        const int64_t n0 = 16 * t0;
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            const float g = got[size_t(m * N + n)], c = canon[size_t(m * N + n)];
            if (n < n0) {
              ASSERT_TRUE(std::isnan(g)) << "row " << n << " outside the tile range was written";
            } else if (G % 2 == 0) {
              ASSERT_EQ(0, std::memcmp(&g, &c, 4)) << "m " << m << " n " << n << ": " << g << " vs " << c;
            } else {
              ASSERT_NEAR(g, c, 1e-5 * (std::fabs(c) + 1)) << "m " << m << " n " << n;
            }
          }
      }
    }
}

// Through the op layer: tiled vs untiled, 1-3 threads, two weight sets sharing a site, and a mixed call.
// A variant without tiled kernels (portable) ignores the tiles: the canonical bits for every M.
TEST_P(TiledKernels, OpLayerSameBitsAnyThreadCount) {
  const bool has_tiles = cpu::kernels().ternary_tiles_q8_x1 != nullptr;
  const auto prev_act = cpu::ternary_activation();
  const int64_t K = 512, N1 = 70, N2 = 19;
  const auto W1 = random_ternary(N1, K, 110, 0.0), W2 = random_ternary(N2, K, 111, 0.0);
  const auto t1 = make_tiles(W1.blocks.data(), nullptr, 0, N1, K), t2 = make_tiles(W2.blocks.data(), nullptr, 0, N2, K);
  for (auto act : {cpu::TernaryActivation::q8, cpu::TernaryActivation::q16}) {
    cpu::set_ternary_activation(act);
    for (int64_t M : {1, 3, 64}) {
      const auto x = randn(size_t(M * K), 112 + uint32_t(M));
      cpu::set_num_threads(1);
      auto c1 = poisoned(size_t(M * N1)), c2 = poisoned(size_t(M * N2));
      const TernaryOut canon[2] = {{W1.blocks.data(), N1, c1.data()}, {W2.blocks.data(), N2, c2.data()}};
      cpu::ternary_matmul_multi(canon, 2, K, x.data(), M);
      std::vector<float> w1(size_t(M * N1)), w2(size_t(M * N2));
      ref::ternary_matmul(W1.blocks.data(), N1, K, x.data(), M, w1.data());
      ref::ternary_matmul(W2.blocks.data(), N2, K, x.data(), M, w2.data());
      const double bound = act == cpu::TernaryActivation::q8 ? 1.5e-2 : 2e-4;
      std::vector<float> first;  // the 1-thread tiled result: every thread count gives the same bits
      for (int threads : {1, 2, 3}) {
        SCOPED_TRACE(testing::Message() << "act " << int(act) << " M " << M << " threads " << threads);
        cpu::set_num_threads(threads);
        auto y1 = poisoned(size_t(M * N1)), y2 = poisoned(size_t(M * N2));
        TernaryOut outs[2] = {{W1.blocks.data(), N1, y1.data()}, {W2.blocks.data(), N2, y2.data()}};
        outs[0].tiles = t1.p;
        outs[1].tiles = t2.p;
        cpu::ternary_matmul_multi(outs, 2, K, x.data(), M);
        if (first.empty()) first = y1;
        EXPECT_EQ(0, std::memcmp(first.data(), y1.data(), 4 * y1.size()));
        EXPECT_LE(max_rel_err(y1.data(), w1.data(), y1.size()), bound);
        EXPECT_LE(max_rel_err(y2.data(), w2.data(), y2.size()), bound);
        if (M > 1 || !has_tiles) {  // the GEMMs agree bit for bit; the canonical matvec sums in another order
          EXPECT_EQ(0, std::memcmp(y1.data(), c1.data(), 4 * y1.size()));
          EXPECT_EQ(0, std::memcmp(y2.data(), c2.data(), 4 * y2.size()));
        } else {
          EXPECT_LE(max_rel_err(y1.data(), c1.data(), y1.size()), 1e-5);
        }
        // Only one set tiled: the whole call takes the canonical kernels (the same bits as `canon`).
        auto z1 = poisoned(size_t(M * N1)), z2 = poisoned(size_t(M * N2));
        TernaryOut mixed[2] = {{W1.blocks.data(), N1, z1.data()}, {W2.blocks.data(), N2, z2.data()}};
        mixed[0].tiles = t1.p;
        cpu::ternary_matmul_multi(mixed, 2, K, x.data(), M);
        EXPECT_EQ(0, std::memcmp(z1.data(), c1.data(), 4 * z1.size()));
      }
    }
  }
  cpu::set_ternary_activation(prev_act);
}

INSTANTIATE_TEST_SUITE_P(Cpu, TiledSimd, ::testing::Values("avx512vnni", "avx512bw", "avx2"),
                         [](const testing::TestParamInfo<const char*>& i) { return std::string(i.param); });
INSTANTIATE_TEST_SUITE_P(Cpu, TiledKernels, ::testing::Values("avx512vnni", "avx512bw", "avx2", "portable"),
                         [](const testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

}  // namespace
