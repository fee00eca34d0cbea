// The L2 side prefetch of a decode step (round 24; CudaBackend::Options::l2_side_kb, BONSAI_CUDA_L2_SIDE).
//
// Why: at batch 1 the DRAM idles while the small kernels between two products run (~1.2 ms of a 4.4 ms token,
// round 22's leave-one-out): a product's blocks can only become resident once the previous product's blocks have left
// their ~200 KB of shared memory, and then fill just their ring (ST stages) before the consumers wait for the
// activations. Round 12 had the product itself prefetch the next one's weights at its end, and every product got
// slower: a grid does not complete before its bulk prefetches have landed, so the prefetch sat on the chain. Here the
// prefetch is its own one-block kernel on a SIDE branch of the step's graph (Launch::after): it starts when the
// previous product completes and nothing waits for it, so the chain goes on while it warms L2 with the next product's
// bytes that each of its blocks will read after its ring (skip_rows .. skip_rows + rows of the block's range).
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace bonsai::cuda {
namespace {

struct L2SideArgs {
  const uint32_t* words[kMaxOuts];   // u32 [N, K/16] per output of the next product
  const uint16_t* scales[kMaxOuts];  // fp16 [N, K/128]
  int64_t N[kMaxOuts];
  int64_t K, units, blocks;  // units: 8-row units of all outputs, split over `blocks` as the product splits them
  int64_t skip_rows, rows;   // per block: rows left to its ring, rows prefetched after them
  int32_t n_outs, hint;      // hint 1: L2::evict_last on the prefetched lines
};

// `bytes` at p into L2 (p and bytes multiples of 16), in chunks spread over the warp's lanes.
__device__ __forceinline__ void prefetch_range(const unsigned char* p, int64_t bytes, bool last, uint64_t pol) {
  constexpr int64_t kChunk = 16 * 1024;
  for (int64_t o = int64_t(threadIdx.x) * kChunk; o < bytes; o += 32 * kChunk) {
    const uint32_t n = uint32_t(min(kChunk, bytes - o));
    if (last)
      asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(p + o), "r"(n), "l"(pol)
                   : "memory");
    else asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + o), "r"(n) : "memory");
  }
}

// One warp per block b of the next product (its unit range [ub0, ub1) as matvec7_kernel computes it), so the
// prefetches are spread over the SMs: a first version issued all of them from one block, and that SM's copy engine
// (~34 GB/s) held its product block back: tg128 219 -> 158 tok/s at 128 KB a block (round 24, call 1).
__global__ void l2_side_kernel(const L2SideArgs a) {
  const int64_t b = blockIdx.x;
  uint64_t pol = 0;
  if (a.hint == 1) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  const int64_t ub0 = a.units * b / a.blocks, ub1 = a.units * (b + 1) / a.blocks;
  int64_t r = ub0 * 8 + a.skip_rows, end = min(ub1 * 8, ub0 * 8 + a.skip_rows + a.rows);  // rows in unit space
  const int64_t rb = a.K / 4, sb = a.K / 64;  // bytes per row: words, scales
  int64_t u0 = 0;  // first unit of output o
  for (int o = 0; o < a.n_outs && r < end; ++o) {
    const int64_t n_units = (a.N[o] + 7) / 8, lo = u0 * 8, hi = lo + a.N[o];  // output o's rows in unit space
    u0 += n_units;
    if (r >= lo + n_units * 8) continue;
    const int64_t r0 = r - lo, r1 = min(end, hi) - lo;  // rows of output o
    if (r1 > r0) {
      prefetch_range(reinterpret_cast<const unsigned char*>(a.words[o]) + r0 * rb, (r1 - r0) * rb, a.hint == 1, pol);
      // scales: the 16-byte-aligned part of the range (a row of scales may not start on 16 bytes)
      const int64_t s0 = (r0 * sb + 15) / 16 * 16, s1 = r1 * sb / 16 * 16;
      if (s1 > s0) prefetch_range(reinterpret_cast<const unsigned char*>(a.scales[o]) + s0, s1 - s0, a.hint == 1, pol);
    }
    r = lo + n_units * 8;
  }
}

}  // namespace

Launch l2_side_launch(const V7Stream& next, int64_t skip_rows, int64_t rows, int hint) {
  L2SideArgs a{};
  for (int i = 0; i < next.n_outs; ++i) {
    a.words[i] = next.words[i];
    a.scales[i] = next.scales[i];
    a.N[i] = next.N[i];
  }
  a.K = next.K;
  a.units = next.units;
  a.blocks = next.blocks;
  a.skip_rows = skip_rows;
  a.rows = rows;
  a.n_outs = next.n_outs;
  a.hint = hint;
  return make_launch(reinterpret_cast<const void*>(&l2_side_kernel), dim3(unsigned(next.blocks)), dim3(32), 0, a);
}

}  // namespace bonsai::cuda
