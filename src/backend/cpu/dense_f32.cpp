// CPU dense fp32 linear (the canonical GDN a/b projections, fp32 [Nv, E]), threaded over output rows.
#include <algorithm>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/thread_pool.h"

namespace bonsai::cpu {

void dense_matmul_f32(const float* w, int64_t N, int64_t K, const float* x, int64_t M, float* y) {
  const auto dot = kernels().dot;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, K * M));
  parallel_for(0, N, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n)
      for (int64_t m = 0; m < M; ++m) y[m * N + n] = dot(w + n * K, x + m * K, K);
  });
}

}  // namespace bonsai::cpu
