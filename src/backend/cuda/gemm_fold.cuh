// GEMM v3's and v4's folded split (gemm3_fold.h) on the device: which tile and K slice a block runs, which output its
// rows belong to, and a split tile's partial sums. nvcc only; shared by gemm_ws.cu (v3) and gemm_f16.cu (v4).
#pragma once
#include <cstdint>

#include "backend/cuda/wgmma.cuh"

namespace bonsai::cuda {

// The block's tile (row block bx, token tile by), its K slice kz of ksl, and its split-tile index (-1: none).
struct FoldTile {
  int64_t bx, by, kz, ksl, split;
};
// kt > 0: the folded split's 1-D grid (tile t = row block t % rb of token tile t / rb; tiles < nfull run all of K, every
// later tile runs as kt blocks of one slice each); else the 3-D grid (row block, token tile, K slice of ks).
__device__ __forceinline__ FoldTile fold_tile(int32_t kt, int64_t nfull, int64_t rb, int64_t ks) {
  FoldTile f{blockIdx.x, blockIdx.y, blockIdx.z, ks, -1};
  if (kt > 0) {
    int64_t t = blockIdx.x;
    f.kz = 0, f.ksl = 1;
    if (t >= nfull) {
      f.split = (t - nfull) / kt;
      f.kz = (t - nfull) - f.split * kt, f.ksl = kt, t = nfull + f.split;
    }
    f.by = t / rb, f.bx = t - f.by * rb;
  }
  return f;
}

// The output (of n_outs) whose row blocks hold row block bx.
__device__ __forceinline__ int fold_out(const Gemm2Out (&o)[kMaxOuts], int n_outs, int64_t bx) {
  int i0 = 0;
#pragma unroll
  for (int i = 1; i < kMaxOuts; ++i)
    if (i < n_outs && bx >= o[i].b0) i0 = i;
  return i0;
}

// A split tile's end, run by its 256 consumer threads (ct = 0..255; named barrier 3): store this slice's V sums per
// thread to part [split tile][slice][V][256] (coalesced), count the block on cnt [split]; false for every block but the
// tile's last, which puts the counter back to zero and sums the slices in order into v (its own read back: the same
// value), V independent loads in flight per slice. The same sums in the same order as splitk_sum_kernel.
template <int V>
__device__ __forceinline__ bool fold_sum(float (&v)[V], float* part, int32_t* cnt, int64_t split, int64_t kz, int64_t ksl,
                                         int ct) {
  __shared__ int fold_last;
  float* pt = part + split * ksl * (256 * V) + ct;  // + z 256 V + 256 i
#pragma unroll
  for (int i = 0; i < V; ++i) __stcg(pt + kz * (256 * V) + 256 * i, v[i]);
  __threadfence();
  asm volatile("bar.sync %0, %1;" ::"r"(3), "r"(256) : "memory");  // the consumers only (the producer may have left)
  if (ct == 0) {
    const int last = atomicAdd(&cnt[split], 1) == int(ksl) - 1;
    if (last) cnt[split] = 0;  // every slice has counted: nothing else touches it in this launch
    fold_last = last;
  }
  asm volatile("bar.sync %0, %1;" ::"r"(3), "r"(256) : "memory");
  if (!fold_last) return false;
  __threadfence();
#pragma unroll
  for (int i = 0; i < V; ++i) v[i] = __ldcg(pt + 256 * i);
  for (int z = 1; z < ksl; ++z)
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] += __ldcg(pt + z * (256 * V) + 256 * i);
  return true;
}

}  // namespace bonsai::cuda
