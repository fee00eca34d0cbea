// Round 11b (prefill): GEMM v3 with its split-K folded in (gemm_ws.cu; Options::gemm3_fold). Plain C++, as kernels.h.
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
Gemm3Fold gemm3_fold_plan(const TernaryDev* outs, int n_outs, int64_t K, int64_t M, int levels, int sms);
// part: float [(tiles - nfull) kt tile_floats]; cnt: int32 [tiles - nfull], zero.
Launch gemm3_fold_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds, int64_t M,
                         int levels, const Gemm3Fold& f, float* part, int32_t* cnt, int cvt);

}  // namespace bonsai::cuda
