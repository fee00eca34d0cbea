// Round 11b (prefill): GEMM v3 with its split-K folded in (gemm_ws.cu; Options::gemm3_fold), and round 13's GEMM v4
// (gemm_f16.cu), which folds its split the same way. Plain C++, as kernels.h.
#pragma once
#include <cstdint>

#include "backend/cuda/kernels.h"

namespace bonsai::cuda {

// A grid of tiles (128 rows x the token tile) over `sms` one-block SMs: below one wave every tile is cut in K as the
// unfused rule cuts it (gemm3_ksplit); from one wave up only the last, partial wave's T tiles, each into kt <= sms / T
// slices (>= kGemm3FoldMinGroups 128-groups each) over the SMs the wave leaves idle (T > sms / 2: every tile as
// gemm3_ksplit cuts them). A split tile's kt blocks write partials [kt][tile_floats] and count themselves on an int32
// counter (zero before, left zero); the last one sums the partials in slice order and writes y: no sum kernel. kt == 1:
// no split (gemm3_launch with ks 1).
constexpr int kGemm3FoldMaxSlices = 8, kGemm3FoldMinGroups = 4;
struct Gemm3Fold {
  int64_t tiles, nfull;  // tiles; the first nfull run all of K
  int kt;                // K slices of each later tile
  int64_t tile_floats;   // partial floats per slice and tile
};
Gemm3Fold gemm3_fold_plan(const TernaryDev* outs, int n_outs, int64_t K, int64_t M, int levels, int sms, int occ = 1);
// The same rule for a grid of B tiles of tile_floats partial floats each over G 128-groups (GEMM v4's plan uses it too).
Gemm3Fold fold_plan(int64_t B, int sms, int64_t G, int64_t tile_floats);
// GEMM v3's blocks-per-SM instance (the occ argument of the launches) for a product of M tokens under
// Options::gemm3_occ `opt` (cuda_backend.h): 9..32 tokens only (else 1). 2: two blocks where the grid has more blocks
// than SMs (round 17); 3 / 4: the double-buffered one-block instance (round 25); 5: two blocks where the product alone
// has >= 2 tiles per SM, else 4.
int gemm3_occ_rule(int opt, const TernaryDev* outs, int n_outs, int64_t K, int64_t M, int levels, int sms);
// part: float [(tiles - nfull) kt tile_floats]; cnt: int32 [tiles - nfull], zero.
Launch gemm3_fold_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds, int64_t M,
                         int levels, const Gemm3Fold& f, float* part, int32_t* cnt, int cvt, int occ = 1,
                         bool row_units = false);

// GEMM v4's block shape (cfg: 0 = 256 rows x 32 tokens, 1 = 256 x 64, 2 = 256 x 128, 3 = 128 x 128) and its folded
// split (fold.kt == 1: none): cfg 0 at M <= 32, else the shape with the fewest rounds of blocks over the SMs (weighted by
// a guess of its speed per MAC); tile > 0 forces cfg tile - 1 (Options::gemm_f16_tile).
struct GemmHPlan {
  int cfg;
  Gemm3Fold fold;
};
GemmHPlan gemmh_plan(const TernaryDev* outs, int n_outs, int64_t K, int64_t M, int sms, int tile = 0);
// part / cnt set: plan's folded split (part float [(tiles - nfull) kt tile_floats], cnt int32 [tiles - nfull], zero);
// else ks K slices over grid.z, partials at y + z * part_stride (then splitk_sum_launch).
Launch gemmh_launch(const TernaryDev* outs, int n_outs, int64_t K, const void* xh, int64_t M, const GemmHPlan& plan,
                    int ks = 1, int64_t part_stride = 0, float* part = nullptr, int32_t* cnt = nullptr);

}  // namespace bonsai::cuda
