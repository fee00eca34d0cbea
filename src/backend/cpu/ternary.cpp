// CPU ternary linear layers (and the small dense bf16 one), threaded over output rows.
//
// ternary_matmul_multi runs all its weight sets in ONE parallel_for over the concatenated row space,
// so q+k+v (or gate+up) cost one dispatch and balance across threads as one matrix would.
#include <algorithm>

#include "backend/cpu/act_q8.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/pq2_rows.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/tiles.h"
#include "util/error.h"

namespace bonsai::cpu {
namespace {

void check_k(int64_t K) {
  if (K <= 0 || K % 128 != 0) fail("ternary_matmul: K = {} is not a positive multiple of 128", K);
}

// Rows per chunk: ~64K multiply-adds of work, a multiple of 4 (the GEMM row tile).
int64_t row_grain(int64_t K, int64_t M) {
  const int64_t g = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, K * M));
  return (g + 3) / 4 * 4;
}

// Rows [lo, hi) of one contiguous stored run: `blocks` is stored row 0 of the run, y its row 0's output.
void run_rows(const uint8_t* blocks, int64_t N, float* y, int64_t K, const float* x, const ActQ8* xq, int64_t M,
              int64_t lo, int64_t hi) {
  const Kernels& kr = kernels();
  if (xq) {
    if (M == 1)
      kr.ternary_rows_q8_x1(blocks, K, lo, hi, xq->q, xq->scale, xq->sum, xq->levels, y + lo);
    else
      kr.ternary_rows_q8_xm(blocks, K, lo, hi, xq->q, xq->scale, xq->sum, xq->levels, M, y + lo, N);
  } else if (M == 1) {
    kr.ternary_rows_x1(blocks, K, lo, hi, x, y + lo);
  } else {
    kr.ternary_rows_xm(blocks, K, lo, hi, x, M, y + lo, N);
  }
}

// Rows [lo, hi) of one weight set; xq: the activation quantised once per call (q8/q16/q24) or nullptr (fp32).
// A row map (o.runs) splits the range at run boundaries: each piece is a contiguous stored range.
void rows(const TernaryOut& o, int64_t K, const float* x, const ActQ8* xq, int64_t M, int64_t lo, int64_t hi) {
  if (o.n_runs == 0) return run_rows(o.blocks, o.N, o.y, K, x, xq, M, lo, hi);
  const uint64_t rb = uint64_t(row_bytes(K));
  for (int64_t i = 0; i < o.n_runs && lo < hi; ++i) {
    const RowRun& r = o.runs[i];
    if (lo >= r.row + r.count) continue;
    const int64_t b = std::min(hi, r.row + r.count);
    // The run's stored rows start at r.src; its outputs at canonical row r.row.
    run_rows(o.blocks + uint64_t(r.src) * rb, o.N, o.y + r.row, K, x, xq, M, lo - r.row, b - r.row);
    lo = b;
  }
}

// Tiles per pool chunk: ~256K multiply-adds of work (an even count at M = 1, where the matvec walks two runs
// of tiles in lockstep).
int64_t tile_grain(int64_t K, int64_t M) {
  const int64_t g = std::max<int64_t>(1, (int64_t(1) << 18) / std::max<int64_t>(1, kTileRows * K * M));
  return M == 1 ? (g + 1) / 2 * 2 : g;
}

// One parallel_for over the weight sets' concatenated index spaces (set i spans size(i) indices: its rows, or
// its tiles), in pool chunks of >= grain: fn(i, a, b) for each piece [a, b) of set i that a chunk covers. So
// q+k+v (or gate+up) cost one dispatch and balance across threads as one matrix would.
template <class Size, class Fn>
void parallel_over_sets(int n_outs, const Size& size, int64_t grain, const Fn& fn) {
  int64_t total = 0;
  for (int i = 0; i < n_outs; ++i) total += size(i);
  parallel_for(0, total, grain, [&](int64_t lo, int64_t hi) {
    int64_t base = 0;
    for (int i = 0; i < n_outs && lo < hi; ++i) {
      const int64_t end = base + size(i);
      if (lo < end) {
        const int64_t a = lo - base, b = std::min(hi, end) - base;
        fn(i, a, b);
        lo = base + b;
      }
      base = end;
    }
  });
}

// All weight sets through the tiled integer kernels, over their concatenated tiles.
void tiled_matmul_multi(const TernaryOut* outs, int n_outs, int64_t K, const ActQ8& xq, int64_t M) {
  const Kernels& kr = kernels();
  parallel_over_sets(
      n_outs, [&](int i) { return tile_count(outs[i].N); }, tile_grain(K, M),
      [&](int i, int64_t a, int64_t b) {
        const TernaryOut& o = outs[i];
        if (M == 1) kr.ternary_tiles_q8_x1(o.tiles, K, o.N, a, b, xq.q, xq.scale, xq.sum, xq.levels, o.y);
        else kr.ternary_tiles_q8_xm(o.tiles, K, o.N, a, b, xq.q, xq.scale, xq.sum, xq.levels, M, o.y, o.N);
      });
}

}  // namespace

void ternary_matmul(const uint8_t* blocks, int64_t N, int64_t K, const float* x, int64_t M, float* y) {
  const TernaryOut o{blocks, N, y};
  ternary_matmul_multi(&o, 1, K, x, M);
}

bool ternary_takes_tiles(const TernaryOut* outs, int n_outs, int64_t M) {
  bool all_tiled = activation_levels(ternary_activation()) > 0 && M > 0 && kernels().ternary_tiles_q8_x1 != nullptr;
  for (int i = 0; i < n_outs; ++i) all_tiled = all_tiled && outs[i].tiles;
  return all_tiled;
}

void ternary_matmul_multi(const TernaryOut* outs, int n_outs, int64_t K, const float* x, int64_t M) {
  check_k(K);
  // Integer-activation modes: one quantisation per activation site, shared by every weight set and thread.
  ActQ8 xq_site{};
  const ActQ8* xq = nullptr;
  if (const int levels = activation_levels(ternary_activation()); levels > 0 && M > 0) {
    xq_site = quantize_activation(x, M, K, levels);
    xq = &xq_site;
    if (ternary_takes_tiles(outs, n_outs, M)) return tiled_matmul_multi(outs, n_outs, K, *xq, M);
  }
  parallel_over_sets(
      n_outs, [&](int i) { return outs[i].N; }, row_grain(K, M),
      [&](int i, int64_t a, int64_t b) { rows(outs[i], K, x, xq, M, a, b); });
}

void ternary_dequant_row(const uint8_t* blocks, int64_t K, int64_t row, float* out) {
  check_k(K);
  const uint8_t* r = blocks + uint64_t(row) * uint64_t(row_bytes(K));
  for (int64_t g = 0; g < K / 128; ++g) {
    const uint8_t* blk = r + g * kPq2Bytes;
    const float d = block_d(blk);
    for (int e = 0; e < 128; ++e) out[g * 128 + e] = float(pq2_block_code(blk, e) - 1) * d;
  }
}

void dense_matmul_bf16(const uint16_t* w, int64_t N, int64_t K, const float* x, int64_t M, float* y) {
  const auto dot = kernels().dot;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, K * M));
  parallel_for(0, N, grain, [&](int64_t lo, int64_t hi) {
    constexpr int64_t kPiece = 512;  // bf16 -> fp32 a piece of a row at a time, reused for every m
    alignas(64) float wf[kPiece];
    float acc[64];
    for (int64_t n = lo; n < hi; ++n)
      for (int64_t m0 = 0; m0 < M; m0 += 64) {
        const int64_t mc = std::min<int64_t>(64, M - m0);
        std::fill(acc, acc + mc, 0.0f);
        for (int64_t e0 = 0; e0 < K; e0 += kPiece) {
          const int64_t len = std::min(kPiece, K - e0);
          for (int64_t e = 0; e < len; ++e) wf[e] = bf16_to_f32(w[n * K + e0 + e]);
          for (int64_t m = 0; m < mc; ++m) acc[m] += dot(wf, x + (m0 + m) * K + e0, len);
        }
        for (int64_t m = 0; m < mc; ++m) y[(m0 + m) * N + n] = acc[m];
      }
  });
}

}  // namespace bonsai::cpu
