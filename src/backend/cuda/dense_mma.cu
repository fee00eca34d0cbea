// The prefill form of the dense a / b pair on the tensor cores (round 29): y = x W^T for bf16 W (GDN's ssm_alpha /
// ssm_beta, [N][K] each, N0 + N1 <= 128 rows together) and fp32 x [M][K], by mma.sync m16n8k16 bf16 -> fp32.
//
// Why: dense_tile_kernel (elementwise.cu, fp32 FFMA, 8 rows x 8 tokens a block) re-reads x once per 8-row tile: at a
// 2,048-token chunk of the 27b (K 5,120, N 96) it took 115 us a launch, 5.6 ms of a pp2048, for 2 GFLOP.
//
// Precision: W is bf16 already (exact as an mma operand). x is split as hi + mid + lo, hi = bf16(x), mid = bf16(x - hi),
// lo = bf16(x - hi - mid): 24 significant bits, so hi + mid + lo == x for every normal x, and each of the three
// products with W is exact in fp32. The mma's fp32 accumulation is not IEEE round-to-nearest, so the sums differ from
// the FFMA kernel's in the last bits; each 32-element chunk goes into a fresh accumulator, added in fp32 (CudaOps.
// DenseMmaBf16MatchesTheTileKernel holds it to the fp64 reference and the tile kernel).
//
// Block = 16 tokens (one m16 tile) x 32 output rows (kDmTiles n-tiles of 8) x 8 warps; warp w takes the 32-element K
// chunks w, w + 8, ... and the 8 warps' partial sums meet through shared memory in a fixed tree (deterministic). Grid
// (M / 16, N / 32): at a 2,048-token chunk of the 27b 384 blocks. (The first version had every row in one block, 12
// n-tiles: 128 blocks at 2,048 tokens and 32 at 512, ptxas held it to 128 registers with the 12 tiles' loads in
// flight, and it ran 145 us a launch, slower than the tile kernel.) Within a chunk
// lane (g, q) = (lane / 4, lane % 4) loads 8 consecutive elements, [8q, 8q + 8), of its rows (x rows g and g + 8, W row
// 8 j + g of each n-tile j) as 16-byte loads, and the mma's k index is permuted so that they are its operands:
// logical k (2q, 2q + 1) / (2q + 8, 2q + 9) of k-step s <-> physical 8q + 4s + (0, 1) / (2, 3). A and B use the same
// permutation, so the dot products are the same sums.
#include <cuda_bf16.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"

namespace bonsai::cuda {
namespace {

constexpr int kDmWarps = 8;
constexpr int kDmThreads = 32 * kDmWarps;
constexpr int kDmTiles = 4;      // n-tiles of 8 rows per block
constexpr int kDmMaxRows = 128;  // N0 + N1 (a bound of the tests' shapes, not of the kernel)

struct DenseMmaArgs {
  const __nv_bfloat16* w0;  // [N0][K]
  const __nv_bfloat16* w1;  // [N1][K] or null
  float* y0;                // [M][N0]
  float* y1;                // [M][N1]
  const float* x;           // [M][K]
  int64_t N0, N1, K, M;
};

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }

// A pair of x as three bf16 pairs: hi, mid, lo (hi + mid + lo == x for normal x).
__device__ __forceinline__ void split3(float x0, float x1, uint32_t& hi, uint32_t& mid, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float r0 = x0 - __low2float(h), r1 = x1 - __high2float(h);  // exact
  const __nv_bfloat162 m = __floats2bfloat162_rn(r0, r1);
  const __nv_bfloat162 l = __floats2bfloat162_rn(r0 - __low2float(m), r1 - __high2float(m));
  hi = bits(h);
  mid = bits(m);
  lo = bits(l);
}

__global__ __launch_bounds__(kDmThreads) void dense_mma_kernel(const DenseMmaArgs a) {
  constexpr int NT = kDmTiles;
  __shared__ float red[kDmWarps / 2][16][NT * 8 + 1];  // [warp slots][token][row]: the partial sums' exchange
  pdl_trigger();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int64_t N = a.N0 + a.N1, m0 = int64_t(blockIdx.x) * 16, n0 = int64_t(blockIdx.y) * (8 * NT);
  // This lane's W rows (8 j + g) and x rows (g, g + 8); rows past N / M read a valid row, their sums are dropped.
  const __nv_bfloat16* wr[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int64_t n = min(n0 + 8 * j + g, N - 1);
    wr[j] = (n < a.N0 ? a.w0 + n * a.K : a.w1 + (n - a.N0) * a.K) + 8 * q;
  }
  pdl_wait();
  const float* xr0 = a.x + min(m0 + g, a.M - 1) * a.K + 8 * q;
  const float* xr1 = a.x + min(m0 + g + 8, a.M - 1) * a.K + 8 * q;
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  for (int64_t k0 = int64_t(warp) * 32; k0 < a.K; k0 += 32 * kDmWarps) {
    const float4 u0 = *reinterpret_cast<const float4*>(xr0 + k0), u1 = *reinterpret_cast<const float4*>(xr0 + k0 + 4);
    const float4 v0 = *reinterpret_cast<const float4*>(xr1 + k0), v1 = *reinterpret_cast<const float4*>(xr1 + k0 + 4);
    uint4 b[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) b[j] = *reinterpret_cast<const uint4*>(wr[j] + k0);
    // A fragments of k-steps s = 0, 1 for each piece: {row g k 2q, row g+8 k 2q, row g k 2q+8, row g+8 k 2q+8}
    uint32_t ah[2][4], am[2][4], al[2][4];
    split3(u0.x, u0.y, ah[0][0], am[0][0], al[0][0]);
    split3(v0.x, v0.y, ah[0][1], am[0][1], al[0][1]);
    split3(u0.z, u0.w, ah[0][2], am[0][2], al[0][2]);
    split3(v0.z, v0.w, ah[0][3], am[0][3], al[0][3]);
    split3(u1.x, u1.y, ah[1][0], am[1][0], al[1][0]);
    split3(v1.x, v1.y, ah[1][1], am[1][1], al[1][1]);
    split3(u1.z, u1.w, ah[1][2], am[1][2], al[1][2]);
    split3(v1.z, v1.w, ah[1][3], am[1][3], al[1][3]);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      // The chunk's 6 mmas into a fresh accumulator (smallest pieces first), added to the total by FADD: the tensor
      // cores' fp32 accumulation truncates, so it only ever sums one chunk (round 12 saw ~900 mmas into one
      // accumulator drift to 2e-5).
      float c[4] = {0.f, 0.f, 0.f, 0.f};
      mma_bf16(c, al[0], b[j].x, b[j].y);
      mma_bf16(c, am[0], b[j].x, b[j].y);
      mma_bf16(c, ah[0], b[j].x, b[j].y);
      mma_bf16(c, al[1], b[j].z, b[j].w);
      mma_bf16(c, am[1], b[j].z, b[j].w);
      mma_bf16(c, ah[1], b[j].z, b[j].w);
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][i] += c[i];
    }
  }
  // Warp sums in a fixed order: w += w + 4, then w + 2, then w + 1 (a tree over the 8 warps).
  auto put = [&](int slot) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      red[slot][g][8 * j + 2 * q] = acc[j][0];
      red[slot][g][8 * j + 2 * q + 1] = acc[j][1];
      red[slot][g + 8][8 * j + 2 * q] = acc[j][2];
      red[slot][g + 8][8 * j + 2 * q + 1] = acc[j][3];
    }
  };
  auto take = [&](int slot) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      acc[j][0] += red[slot][g][8 * j + 2 * q];
      acc[j][1] += red[slot][g][8 * j + 2 * q + 1];
      acc[j][2] += red[slot][g + 8][8 * j + 2 * q];
      acc[j][3] += red[slot][g + 8][8 * j + 2 * q + 1];
    }
  };
#pragma unroll
  for (int half = kDmWarps / 2; half >= 1; half /= 2) {
    if (warp >= half && warp < 2 * half) put(warp - half);
    __syncthreads();
    if (warp < half) take(warp);
    __syncthreads();
  }
  if (warp != 0) return;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t m = m0 + g + (i >> 1) * 8, n = n0 + 8 * j + 2 * q + (i & 1);
      if (m >= a.M || n >= N) continue;
      if (n < a.N0) a.y0[m * a.N0 + n] = acc[j][i];
      else a.y1[m * a.N1 + (n - a.N0)] = acc[j][i];
    }
}

}  // namespace

bool dense_mma_supported(const DenseDev* outs, int n_outs, bool bf16, int64_t K, const float* x, int64_t M) {
  const char* e = std::getenv("BONSAI_CUDA_DENSE_MMA");  // round 29 A/B switch (default on; read per prefill launch)
  if (e && e[0] == '0' && e[1] == 0) return false;
  const int64_t N = outs[0].N + (n_outs > 1 ? outs[1].N : 0);
  return bf16 && M > 32 && K % 32 == 0 && N >= 1 && N <= kDmMaxRows && aligned16(x) && aligned16(outs[0].w) &&
         (n_outs < 2 || aligned16(outs[1].w));
}

Launch dense_mma_launch(const DenseDev* outs, int n_outs, int64_t K, const float* x, int64_t M) {
  DenseMmaArgs a{};
  a.w0 = static_cast<const __nv_bfloat16*>(outs[0].w);
  a.y0 = outs[0].y;
  a.N0 = outs[0].N;
  if (n_outs > 1) {
    a.w1 = static_cast<const __nv_bfloat16*>(outs[1].w);
    a.y1 = outs[1].y;
    a.N1 = outs[1].N;
  }
  a.x = x;
  a.K = K;
  a.M = M;
  const int64_t rows = 8 * kDmTiles;
  return make_launch(reinterpret_cast<const void*>(&dense_mma_kernel),
                     dim3(unsigned((M + 15) / 16), unsigned((a.N0 + a.N1 + rows - 1) / rows)), dim3(kDmThreads), 0, a);
}

}  // namespace bonsai::cuda
