// What the two decode attention kernels share (nvcc only): their argument struct, and the end of a block: the merge
// of its warps' running softmax states and, over several splits, the merge of the splits' partials by the last block
// of a (row, head group) to finish. attention_kernel (mixers.cu: K / V rows through registers, one step ahead) and
// attention_ring_kernel (attn_decode_ring.cu: K / V tiles through a bulk-copy ring in shared memory).
#pragma once
#include "backend/cuda/common.cuh"

namespace bonsai::cuda {

struct AttnArgs {
  const float* q;
  const float* k;
  const float* v;
  float* out;
  float* part_o;
  float* part_ml;
  int32_t* counters;
  int64_t M, p0, Hq, Hkv, D;
  int32_t splits;
  float scale;
  int32_t hsplit;  // AttnDesc::hsplit: blockIdx.y = kvh * hsplit + (which G / hsplit query heads of KV head kvh)
  int32_t fence;   // the ring kernel: proxy_fence_mode() (mbarrier.cuh)
};

// Called by every thread of an NT-thread block once s_ml [NW][GM][2] (each warp's running max and sum per query head)
// and s_acc [NW][G][D] (its unnormalised output) are published (a __syncthreads before). Merges the NW warps for the
// block's G query heads h0 .. h0 + G - 1 of query row m; with one split it writes out, else this split's partial
// (part_o [M, Hq, S, D], part_ml [M, Hq, S, 2]) and, in the last of the S blocks to arrive on counters[counter], the
// merge of all S partials into out (that block then resets the counter for the next launch: graph replays).
// last: a __shared__ flag.
template <int NW, int GM, int NT>
__device__ __forceinline__ void attn_merge(const AttnArgs& a, const float (*s_ml)[GM][2], const float* s_acc, int G,
                                           int64_t m, int64_t h0, int split, int64_t counter, bool* last) {
  const int S = a.splits, D = int(a.D);
  for (int idx = threadIdx.x; idx < G * D; idx += NT) {
    const int hh = idx / D, d = idx % D;
    float Mx = -INFINITY;
    for (int w = 0; w < NW; ++w) Mx = fmaxf(Mx, s_ml[w][hh][0]);
    float L = 0.f, A = 0.f;
    if (Mx != -INFINITY) {
      for (int w = 0; w < NW; ++w) {
        const float f = __expf(s_ml[w][hh][0] - Mx);
        L += s_ml[w][hh][1] * f;
        A += s_acc[(w * G + hh) * D + d] * f;
      }
    }
    const int64_t h = h0 + hh;
    if (S == 1) {
      a.out[(m * a.Hq + h) * a.D + d] = A / L;
    } else {
      a.part_o[((m * a.Hq + h) * S + split) * a.D + d] = A;
      if (d == 0) {
        a.part_ml[((m * a.Hq + h) * S + split) * 2] = Mx;
        a.part_ml[((m * a.Hq + h) * S + split) * 2 + 1] = L;
      }
    }
  }
  if (S == 1) return;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) *last = atomicAdd(&a.counters[counter], 1) == S - 1;
  __syncthreads();
  if (!*last) return;
  __threadfence();
  constexpr int kMaxSplits = int(kAttnMaxSplits);
  for (int idx = threadIdx.x; idx < G * D; idx += NT) {
    const int hh = idx / D, d = idx % D;
    const int64_t h = h0 + hh;
    const float* ml = a.part_ml + (m * a.Hq + h) * S * 2;
    const float* po = a.part_o + (m * a.Hq + h) * S * a.D;
    // S <= kMaxSplits: fully unrolled so the L2 loads of all splits are in flight together (a runtime
    // loop made them one round trip each: 63 us per call at decode).
    float ms[kMaxSplits], ls[kMaxSplits], os[kMaxSplits];
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      ms[s] = s < S ? __ldcg(ml + 2 * s) : -INFINITY;
      ls[s] = s < S ? __ldcg(ml + 2 * s + 1) : 0.f;
      os[s] = s < S ? __ldcg(po + int64_t(s) * a.D + d) : 0.f;
    }
    float Mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) Mx = fmaxf(Mx, ms[s]);
    float L = 0.f, A = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      if (ms[s] == -INFINITY) continue;
      const float f = __expf(ms[s] - Mx);
      L += ls[s] * f;
      A += os[s] * f;
    }
    a.out[(m * a.Hq + h) * a.D + d] = A / L;
  }
  if (threadIdx.x == 0) a.counters[counter] = 0;  // ready for the next launch (graph replays)
}

}  // namespace bonsai::cuda
