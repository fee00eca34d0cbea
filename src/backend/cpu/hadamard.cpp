// CPU blockwise Walsh-Hadamard rotation: one (row, block) pair per work item, the block's FWHT from the
// kernel table. The 1024-float block (4 KiB) stays in L1 through all its stages.
#include <cmath>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/thread_pool.h"
#include "util/error.h"

namespace bonsai::cpu {
namespace {

void rotate(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block, bool sign_first) {
  if (block <= 0 || (block & (block - 1)) != 0) fail("hadamard: block {} is not a power of two", block);
  if (K % block != 0) fail("hadamard: K = {} is not a multiple of block {}", K, block);
  const float scale = float(1.0 / std::sqrt(double(block)));
  const int64_t per_row = K / block;
  const auto fwht = kernels().fwht_block;
  // ~16K elements per chunk: a 1024-block costs ~2 us, below that threading does not pay.
  const int64_t grain = std::max<int64_t>(1, 16384 / block);
  parallel_for(0, rows * per_row, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t r = u / per_row, b0 = (u % per_row) * block;
      const int8_t* s = signs ? signs + b0 : nullptr;
      fwht(x + r * K + b0, block, sign_first ? s : nullptr, sign_first ? nullptr : s, scale);
    }
  });
}

}  // namespace

void hadamard_forward(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block) {
  rotate(x, rows, K, signs, block, /*sign_first=*/true);
}

void hadamard_inverse(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block) {
  rotate(x, rows, K, signs, block, /*sign_first=*/false);
}

}  // namespace bonsai::cpu
