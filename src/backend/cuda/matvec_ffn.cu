// The decode FFN in one launch (round 15; Options::ffn_fused): gate+up (matvec v7's k32 step), the silu(gate) * up
// site, and down (v7's k16 step), for one token under q16.
//
// Why: a decode token is ~4.5 ms where its weights at the read probe take ~1.6 ms. Each v7 launch pays a ramp (its
// first stage lands before any consumer works) and a tail (its last stage is computed with no bytes streaming), ~4.5 us
// a launch over its bytes (round 14's kernel table), plus the site kernel's hop on the chain between two products. The
// weights do not depend on the activations, so ONE producer warp per SM can stream gate+up's rows and then down's rows
// without a gap: down's first stages land while the consumers finish gate+up, wait for the grid and compute the site.
//
// Shape: one block per SM (all resident: every block needs a whole SM's shared memory, and the grid is at most the SM
// count), one producer warp + NW consumer warps (NW = gate+up's steps per row, <= 20: each warp one step, its
// activation held in registers). Phase 1: gate+up's 32-row stages (v7's units, bulk copies, full / empty mbarriers,
// partials summed in warp order by the producer, which writes gate / up). Phase 2: down's 16-row stages in the same
// ring memory, cut differently: a phase-2 slot is copied into as soon as the phase-1 stages that overlap its bytes are
// consumed. Between the phases, two grid-wide counters (count[0]: blocks whose gate / up rows are written; count[1]:
// site chunks written) and the site: block b < K2 / 1024 computes chunk b with four consumer warps (warp_site.cuh's
// slot functions, site_row_kernel's operations: the digits are the site kernel's bit for bit) into global scratch,
// then every block stages the whole activation in shared memory. The last block to leave zeroes the counters.
// Results: gate / up and the digits equal the unfused launches'; down sums its warps' partials in another grouping
// (NW warps instead of v7's 17), so it agrees to fp32 rounding.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/matvec_step.cuh"
#include "backend/cuda/mbarrier.cuh"
#include "backend/cuda/warp_site.cuh"

namespace bonsai::cuda {
namespace {

constexpr int kFfnMaxWarps = 20;  // consumer warps; one more is the producer
constexpr int kFfnSmem = 227 * 1024 - 1024;
constexpr int kTok = 2;  // q16 at one token: the accumulator lanes hold the token's two groups

struct FfnOut {
  const uint32_t* words;  // u32 [N, K/16] canonical
  const uint16_t* scales;  // fp16 [N, K/128]
  float* y;                // [N]
  int64_t N;
  int64_t u0;              // its first 8-row unit in the phase's unit space
};
struct FfnArgs {
  FfnOut o1[2];          // gate, up (phase 1, K1)
  FfnOut o2;             // down (phase 2, K2 = gate's N)
  const int8_t* xq1;     // int8 [2, K1] gate+up's input, q16 digit planes (ternary.cu's transposed layout)
  const float2* xds1;    // [K1/64]
  int8_t* xq2;           // int8 [2, K2] down's input, written by the site blocks (scratch of this launch)
  float2* xds2;          // [K2/64]
  SitePrologue site;     // silu(gate) * up -> signs, FWHT, digits (src = gate's y, src2 = up's y)
  int32_t* count;        // int32 [3] {blocks with gate / up written, site chunks written, departures}; zero, left zero
  int32_t K1, K2, units1, units2;
  int32_t st1, st2;            // ring depths of the two phases
  int32_t stage1, words1;      // phase-1 stage bytes (words u32 [32, K1/16] then scales fp16 [32, K1/128])
  int32_t stage2, words2;      // phase-2 stage bytes (16 rows of K2)
  int32_t red_off, bar_off;    // byte offsets: the partials / staging union, the mbarriers
  int32_t place, pad_;         // 1: phase-2 slots over the phase-1 slots freed first (BONSAI_CUDA_FFN_PLACE=0: k x stage2)
};

__device__ __forceinline__ int ld_acquire_gpu(const int32_t* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// The consumers wait until *p >= target (thread 0 polls, back to back for the first 2^14 polls; then with a sleep,
// and a trap after ~4 s instead of a hang), then meet.
__device__ __forceinline__ void consumers_wait_count(const int32_t* p, int target, int nthreads) {
  if (threadIdx.x == 0) {
    unsigned spins = 0;
    while (ld_acquire_gpu(p) < target) {
      if (++spins > (1u << 14)) __nanosleep(256);
      if (spins > (1u << 24)) __trap();
    }
  }
  asm volatile("bar.sync 1, %0;" ::"r"(nthreads) : "memory");
}

// A phase's stages from unit u of the block's range [.., ub1): up to TR rows of one output (v7's stage_at).
template <int TR, int NO>
__device__ __forceinline__ int ffn_stage_at(const FfnOut (&o)[NO], int u, int ub1, int& oi, int64_t& r0, int& nrow) {
  oi = 0;
#pragma unroll
  for (int i = 1; i < NO; ++i)
    if (u >= o[i].u0) oi = i;
  r0 = int64_t(u - o[oi].u0) * 8;
  nrow = int(min(min(int64_t(TR), o[oi].N - r0), int64_t(ub1 - u) * 8));
  return u + (nrow + 7) / 8;
}

// The producer's copy of one stage: nrow rows x K from r0 (words, then scales; a ragged scale run by the warp).
__device__ __forceinline__ void ffn_issue(const FfnOut& O, int64_t r0, int nrow, int K, unsigned char* st, int words_bytes,
                                          uint64_t* full, int lane) {
  const int G = K >> 7;
  const unsigned wbytes = unsigned(nrow) * unsigned(K >> 2), sbytes = unsigned(nrow) * unsigned(K >> 6);
  const bool sbulk = sbytes % 16 == 0;
  if (!sbulk) {
    auto* dst = reinterpret_cast<uint16_t*>(st + words_bytes);
    const uint16_t* src = O.scales + r0 * G;
    for (int e = lane; e < nrow * G; e += 32) dst[e] = __ldg(src + e);
    __syncwarp();
  }
  if (lane == 0) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    mbar_expect_tx(full, wbytes + (sbulk ? sbytes : 0u));
    bulk_load(st, O.words + r0 * (K >> 4), wbytes, full);
    if (sbulk) bulk_load(st + words_bytes, O.scales + r0 * G, sbytes, full);
  }
  __syncwarp();
}

// The producer's sum of one consumed stage: the NW warps' partials of red slot `slot` in warp order -> y.
template <int TR>
__device__ __forceinline__ void ffn_sum(const float* red, int slot, int NW, const FfnOut& O, int64_t r0, int nrow,
                                        int lane) {
#pragma unroll
  for (int e0 = 0; e0 < TR; e0 += 32) {
    const int rr = e0 + lane;
    if (rr >= nrow) continue;
    const float* p = red + size_t(slot) * NW * kTok * TR + rr;  // + ww kTok TR for warp ww (token 0)
    float pv[kFfnMaxWarps];
#pragma unroll
    for (int ww = 0; ww < kFfnMaxWarps; ++ww) pv[ww] = ww < NW ? p[ww * kTok * TR] : 0.f;
    float v = 0.f;
#pragma unroll
    for (int ww = 0; ww < kFfnMaxWarps; ++ww)
      if (ww < NW) v += pv[ww];
    O.y[r0 + rr] = v;
  }
}

// The consumers' walk of one phase (v7's consumer loop at M = 1, q16): nt stages of `stage_bytes` in ST ring slots,
// each warp taking steps w, w + NW, .. of every stage, partials into red slot j % (ST + 1). B: hoisted (S == NW, read
// from xq in global memory) or per step from xq (the staged copy in shared memory, k16 order).
// off: the slots' byte offsets in the ring (shared memory), or null for slot s at s x stage_bytes.
template <int RB, bool K32>
__device__ __forceinline__ void ffn_consume(const unsigned char* ring, int stage_bytes, int words_bytes, const int* off,
                                            int K, int ST, int nt, uint64_t* full, uint64_t* empty, float* red,
                                            const int8_t* xq, const float2* xds, int NW, int w, int lane) {
  constexpr int LV = 2, TR = 16 * RB;
  const int G = K >> 7, S = (G + 1) >> 1;
  const int g = lane >> 2, t = lane & 3;
  const int bm = g >> 2, bl = g & 1, bg = (g >> 1) & 1;
  const bool b_on = bg == (t >> 1) && bm < 1;
  const uint4* xbp = reinterpret_cast<const uint4*>(xq + (b_on ? (int64_t(bm) * LV + bl) * K + bg * 128 + 64 * (t & 1) : 0));
  const int cs_b = b_on ? (G - bg + 1) >> 1 : 0;
  const int cm = t >> 1;
  const bool c_on = cm < 1;
  const float4* xd = reinterpret_cast<const float4*>(xds);
  const int cs_c = c_on ? (G - (t & 1) + 1) >> 1 : 0;
  const int lim_s = (G - (t & 1) + 1) >> 1;
  uint4 X[4];
  float4 xv0, xv1 = make_float4(0.f, 0.f, 0.f, 0.f);
  auto load_b = [&](int c) {
    if (c < cs_b) {
      const uint4* xp = xbp + 16 * c;
#pragma unroll
      for (int i = 0; i < 4; ++i) X[i] = xp[i];
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) X[i] = make_uint4(0, 0, 0, 0);
    }
    xv0 = c < cs_c ? xd[2 * c + (t & 1)] : make_float4(0.f, 0.f, 0.f, 0.f);
  };
  const bool hoist = S == NW;
  if (hoist) {
    load_b(w);
    if constexpr (K32) {
      uint4 XP[4];
      mv7_pair_order(X, XP);
#pragma unroll
      for (int i = 0; i < 4; ++i) X[i] = XP[i];
    }
  }
  const int rs = K >> 2;
  const bool holder = c_on && (t & 1) == 0;
  int s = 0, slot = 0;
  unsigned ph = 0;
  for (int j = 0; j < nt; ++j) {
    mbar_wait(&full[s], ph);
    const unsigned char* st = ring + (off ? size_t(off[s]) : size_t(s) * stage_bytes);
    const unsigned char* wrow = st + g * rs + 16 * t;
    const uint16_t* srow = reinterpret_cast<const uint16_t*>(st + words_bytes) + g * G + (t & 1);
    float yg[RB], yg8[RB];
#pragma unroll
    for (int b = 0; b < RB; ++b) yg[b] = yg8[b] = 0.f;
    for (int c = w; c < S; c += NW) {
      if (!hoist) load_b(c);
      Mv6Stage<RB> sv;
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        sv.wa[b] = *reinterpret_cast<const uint4*>(wrow + 16 * b * rs + 64 * c);
        sv.wb[b] = *reinterpret_cast<const uint4*>(wrow + (16 * b + 8) * rs + 64 * c);
        const uint16_t* q = srow + 16 * b * G + 2 * c;
        sv.sc[b] = c < lim_s ? uint32_t(q[0]) | uint32_t(q[8 * G]) << 16 : 0u;
      }
      if constexpr (K32) mv7_step32<LV, RB>(sv, X, xv0, xv1, yg, yg8);
      else mv6_step<LV, RB>(sv, X, xv0, xv1, yg, yg8);
    }
#pragma unroll
    for (int b = 0; b < RB; ++b) {  // lanes t, t ^ 1 hold the token's two groups
      yg[b] += __shfl_xor_sync(0xffffffffu, yg[b], 1);
      yg8[b] += __shfl_xor_sync(0xffffffffu, yg8[b], 1);
    }
    if (holder) {
      float* p = red + ((size_t(slot) * NW + w) * kTok + cm) * TR + g;
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        p[16 * b] = yg[b];
        p[16 * b + 8] = yg8[b];
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
    if (++s == ST) s = 0, ph ^= 1u;
    if (++slot == ST + 1) slot = 0;
  }
}

__global__ __launch_bounds__((kFfnMaxWarps + 1) * 32, 1) void ffn7_kernel(const FfnArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int TR1 = 32, TR2 = 16;
  const int NW = int(blockDim.x >> 5) - 1;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int nblk = int(gridDim.x), K1 = a.K1, K2 = a.K2, ST1 = a.st1, ST2 = a.st2;
  const int ub1 = int(int64_t(a.units1) * blockIdx.x / nblk), ue1 = int(int64_t(a.units1) * (blockIdx.x + 1) / nblk);
  const int ub2 = int(int64_t(a.units2) * blockIdx.x / nblk), ue2 = int(int64_t(a.units2) * (blockIdx.x + 1) / nblk);
  const FfnOut o2[1] = {a.o2};
  int n1 = 0, n2 = 0;  // the block's stages per phase
  for (int u = ub1; u < ue1; ++n1) {
    int oi, nr;
    int64_t r0;
    u = ffn_stage_at<TR1>(a.o1, u, ue1, oi, r0, nr);
  }
  for (int u = ub2; u < ue2; ++n2) {
    int oi, nr;
    int64_t r0;
    u = ffn_stage_at<TR2>(o2, u, ue2, oi, r0, nr);
  }
  // Shared memory: ring [max(ST1 stage1, ST2 stage2)] | union { red1 float [ST1 + 1][NW][2][32] ; red2 float [ST2 +
  // 1][NW][2][16], xs int8 [2, K2], xds float2 [K2/64], site scratch float [128][8] } | full1, empty1 [ST1], full2,
  // empty2 [ST2]. red1 is read by the producer until its block's gate / up rows are written, the rest of the union
  // written only once every producer has written them (count[0]).
  unsigned char* ring = smem;
  float* red1 = reinterpret_cast<float*>(smem + a.red_off);
  float* red2 = red1;
  unsigned char* xs = reinterpret_cast<unsigned char*>(red2 + size_t(ST2 + 1) * NW * kTok * TR2);
  float2* xds_s = reinterpret_cast<float2*>(xs + 2 * K2);
  float* scratch = reinterpret_cast<float*>(xds_s + (K2 >> 6));
  uint64_t* full1 = reinterpret_cast<uint64_t*>(smem + a.bar_off);
  uint64_t* empty1 = full1 + ST1;
  uint64_t* full2 = empty1 + ST1;
  uint64_t* empty2 = full2 + ST2;
  // Phase-2 slot k at byte off2[k] of the ring, placed over the phase-1 slots that the block's last phase-1 stages free
  // first (slot (n1 + q) % ST1 is freed q-th), so down's first copies start before gate+up's last stages are computed;
  // need2[k]: the phase-1 stage whose consumption frees it (-1: free at once). (a.place 0: slot k at k x stage2.)
  __shared__ int off2[4], need2[4];
  if (threadIdx.x == 0) {
    const int64_t B1 = a.stage1, B2 = a.stage2, R = max(int64_t(ST1) * B1, int64_t(ST2) * B2);
    auto freed = [&](int64_t lo, int64_t hi) {  // the freeing position of the last phase-1 slot in [lo, hi), or -1
      int last = -1;
      for (int sl = 0; sl < ST1; ++sl) {
        if (!(sl * B1 < hi && lo < (sl + 1) * B1)) continue;
        const int q = n1 >= ST1 ? (sl - n1 % ST1 + ST1) % ST1 : (sl < n1 ? sl : -1);
        last = max(last, q);
      }
      return last;
    };
    for (int k = 0; k < ST2; ++k) {
      int64_t best = int64_t(k) * B2;
      int best_q = freed(best, best + B2);
      if (a.place) {
        best_q = 1 << 30;
        for (int c = 0; c <= ST1; ++c) {  // candidates: each phase-1 slot's start, and the ring's end
          const int64_t o = c < ST1 ? c * B1 : R - B2;
          if (o < 0 || o + B2 > R) continue;
          bool clash = false;
          for (int j = 0; j < k; ++j) clash |= o < off2[j] + B2 && off2[j] < o + B2;
          if (clash) continue;
          const int q = freed(o, o + B2);
          if (q < best_q) best_q = q, best = o;
        }
      }
      off2[k] = int(best);
      need2[k] = best_q < 0 ? -1 : (n1 >= ST1 ? n1 - ST1 + best_q : best_q);
    }
    for (int s = 0; s < ST1; ++s) mbar_init(&full1[s], 1), mbar_init(&empty1[s], unsigned(NW));
    for (int s = 0; s < ST2; ++s) mbar_init(&full2[s], 1), mbar_init(&empty2[s], unsigned(NW));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  // Every block is resident before any can trigger (one block per SM, grid <= SMs), so the dependents launched early
  // cannot take an SM a block of this grid still waits for: the grid-wide waits below always end.
  pdl_trigger();

  if (w == NW) {  // ---- producer ----
    const int first2 = min(ST2, n2);  // phase-2 stages issued during the transition (at most one ring round)
    int k2 = 0, u2 = ub2;
    auto issue2 = [&]() {
      int oi, nr;
      int64_t r0;
      u2 = ffn_stage_at<TR2>(o2, u2, ue2, oi, r0, nr);
      ffn_issue(a.o2, r0, nr, K2, ring + off2[k2 % ST2], a.words2, &full2[k2 % ST2], lane);
      ++k2;
    };
    bool waited = false;
    int s = 0, es = 0, slot = 0, u_issue = ub1, u_sum = ub1;
    unsigned eph = 0;
    for (int i = 0; i < n1 + ST1; ++i) {
      if (i >= ST1) mbar_wait(&empty1[es], eph);
      if (i < n1) {
        int oi, nr;
        int64_t r0;
        u_issue = ffn_stage_at<TR1>(a.o1, u_issue, ue1, oi, r0, nr);
        ffn_issue(a.o1[oi], r0, nr, K1, ring + size_t(s) * a.stage1, a.words1, &full1[s], lane);
        if (++s == ST1) s = 0;
      }
      if (i >= ST1) {
        if (!waited) {
          pdl_wait();  // gate / up may still be read by earlier kernels
          waited = true;
        }
        int oi, nr;
        int64_t r0;
        u_sum = ffn_stage_at<TR1>(a.o1, u_sum, ue1, oi, r0, nr);
        ffn_sum<TR1>(red1, slot, NW, a.o1[oi], r0, nr, lane);
        if (++es == ST1) es = 0, eph ^= 1u;
        if (++slot == ST1 + 1) slot = 0;
      }
      // Once every phase-1 stage is issued: down's first stages into the memory already consumed.
      if (i >= n1 - 1)
        while (k2 < first2 && need2[k2] <= i - ST1) issue2();
    }
    if (!waited) pdl_wait();
    // This block's gate / up rows are written: count it (the site blocks read every block's).
    __threadfence();
    __syncwarp();
    if (lane == 0) atomicAdd(&a.count[0], 1);
    s = 0, es = 0, slot = 0, eph = 0;
    int u2_sum = ub2;
    for (int i = 0; i < n2 + ST2; ++i) {
      if (i >= ST2) mbar_wait(&empty2[es], eph);
      if (i < n2 && i >= k2) issue2();
      if (i >= ST2) {
        int oi, nr;
        int64_t r0;
        u2_sum = ffn_stage_at<TR2>(o2, u2_sum, ue2, oi, r0, nr);
        ffn_sum<TR2>(red2, slot, NW, a.o2, r0, nr, lane);
        if (++es == ST2) es = 0, eph ^= 1u;
        if (++slot == ST2 + 1) slot = 0;
      }
    }
    return;
  }

  // ---- consumers ----
  pdl_wait();  // gate+up's input
  ffn_consume<2, true>(ring, a.stage1, a.words1, nullptr, K1, ST1, n1, full1, empty1, red1, a.xq1, a.xds1, NW, w, lane);
  // Every block's gate / up rows written: the site chunks.
  consumers_wait_count(&a.count[0], nblk, NW * 32);
  const int nchunks = K2 >> 10;
  if (int(blockIdx.x) < nchunks && w < 4) {
    const int tq = w * 32 + lane, e = int(blockIdx.x << 10) + 8 * tq;
    float v[8];
    site_slot_front(a.site, e, lane, 0.f, false, nullptr, v);
    if ((1 << a.site.log2n) > 256) {
      store8(scratch + tq * 8, v);
      asm volatile("bar.sync 2, 128;" ::: "memory");
      site_slot_exchange(1 << a.site.log2n, w, lane, scratch, v);
    }
    site_slot_quantise<2>(a.site, K2, e, lane, nullptr, a.xq2, a.xds2, v);
    __threadfence();
  }
  asm volatile("bar.sync 1, %0;" ::"r"(NW * 32) : "memory");
  if (threadIdx.x == 0 && int(blockIdx.x) < nchunks) atomicAdd(&a.count[1], 1);
  consumers_wait_count(&a.count[1], nchunks, NW * 32);
  {  // down's activation into shared memory (from L2: other SMs wrote it)
    const int nq = 2 * K2 / 16, nd = (K2 >> 6) / 2;
    for (int e = threadIdx.x; e < nq; e += NW * 32)
      reinterpret_cast<uint4*>(xs)[e] = __ldcg(reinterpret_cast<const uint4*>(a.xq2) + e);
    for (int e = threadIdx.x; e < nd; e += NW * 32)
      reinterpret_cast<float4*>(xds_s)[e] = __ldcg(reinterpret_cast<const float4*>(a.xds2) + e);
    asm volatile("bar.sync 1, %0;" ::"r"(NW * 32) : "memory");
  }
  ffn_consume<1, false>(ring, a.stage2, a.words2, off2, K2, ST2, n2, full2, empty2, red2,
                        reinterpret_cast<const int8_t*>(xs), xds_s, NW, w, lane);
  // The last block out zeroes the counters for the next launch (every block has passed both waits by then).
  if (threadIdx.x == 0 && atomicAdd(&a.count[2], 1) == nblk - 1) {
    a.count[0] = 0;
    a.count[1] = 0;
    a.count[2] = 0;
  }
}

struct FfnShape {
  int nw = 0, st1 = 0, st2 = 0;
  int64_t stage1 = 0, words1 = 0, stage2 = 0, words2 = 0, red_off = 0, bar_off = 0, smem = 0;
};
// The shared-memory plan (FfnArgs) for gate+up over K1 and down over K2, or nw = 0 where it does not fit.
FfnShape ffn_shape(int64_t K1, int64_t K2) {
  FfnShape f;
  const int64_t steps1 = (K1 / 128 + 1) / 2;
  if (K1 % 256 != 0 || steps1 < 4 || steps1 > kFfnMaxWarps || K2 % 1024 != 0) return f;
  const int nw = int(steps1);
  f.words1 = 32 * K1 / 4;
  f.stage1 = f.words1 + 32 * K1 / 64;
  f.words2 = 16 * K2 / 4;
  f.stage2 = f.words2 + 16 * K2 / 64;
  // The deepest phase-2 ring (2..4 stages), then the deepest phase-1 ring (2..8) that fit beside it.
  for (int st2 = 4; st2 >= 2; --st2)
    for (int st1 = 8; st1 >= 2; --st1) {
      const int64_t ring = std::max<int64_t>(st2 * f.stage2, st1 * f.stage1);
      const int64_t u1 = int64_t(st1 + 1) * nw * kTok * 32 * 4;
      const int64_t u2 = int64_t(st2 + 1) * nw * kTok * 16 * 4 + 2 * K2 + K2 / 64 * 8 + 128 * 8 * 4;
      const int64_t red_off = (ring + 127) / 128 * 128;
      const int64_t bar_off = (red_off + std::max(u1, u2) + 15) / 16 * 16;
      const int64_t smem = bar_off + 16 * (st1 + st2);
      if (smem <= kFfnSmem) {
        f.nw = nw, f.st1 = st1, f.st2 = st2, f.red_off = red_off, f.bar_off = bar_off, f.smem = smem;
        return f;
      }
    }
  return f;
}

}  // namespace

bool ffn_fused_supported(int64_t K1, int64_t N, int64_t K2, int64_t N2, int sms) {
  // Every block owns phase-1 stages and phase-2 rows, and the site's K2 / 1024 chunks have a block each.
  return K2 == N && N2 >= 1 && ffn_shape(K1, K2).nw > 0 && sms >= 1 && (N2 + 7) / 8 >= sms &&
         (2 * N + 7) / 8 >= 4 * int64_t(sms) && K2 / 1024 <= sms;
}

Launch ffn_fused_launch(const TernaryDev& gate, const TernaryDev& up, const TernaryDev& down, int64_t K1,
                        const int8_t* xq1, const float2* xds1, const SiteDesc& site, int8_t* xq2, float2* xds2,
                        int32_t* counters, int sms) {
  static const bool attr = [] {
    if (cudaFuncSetAttribute(reinterpret_cast<const void*>(&ffn7_kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kFfnSmem) != cudaSuccess)
      (void)cudaGetLastError();
    return true;
  }();
  (void)attr;
  const int64_t K2 = gate.N;
  const FfnShape f = ffn_shape(K1, K2);
  FfnArgs a{};
  a.o1[0] = {gate.words, gate.scales, gate.y, gate.N, 0};
  a.o1[1] = {up.words, up.scales, up.y, up.N, (gate.N + 7) / 8};
  a.o2 = {down.words, down.scales, down.y, down.N, 0};
  a.xq1 = xq1;
  a.xds1 = xds1;
  a.xq2 = xq2;
  a.xds2 = xds2;
  a.site = site_prologue_of(site);
  a.site.resid = nullptr;
  a.site.pre_out = nullptr;
  a.count = counters;
  a.K1 = int32_t(K1);
  a.K2 = int32_t(K2);
  a.units1 = int32_t((gate.N + 7) / 8 + (up.N + 7) / 8);
  a.units2 = int32_t((down.N + 7) / 8);
  a.st1 = f.st1;
  a.st2 = f.st2;
  a.stage1 = int32_t(f.stage1);
  a.words1 = int32_t(f.words1);
  a.stage2 = int32_t(f.stage2);
  a.words2 = int32_t(f.words2);
  a.red_off = int32_t(f.red_off);
  a.bar_off = int32_t(f.bar_off);
  static const int place = [] {
    const char* e = std::getenv("BONSAI_CUDA_FFN_PLACE");
    return e && *e ? std::atoi(e) : 1;
  }();
  a.place = place;
  const int blocks = int(std::min<int64_t>(sms, a.units2));
  return make_launch(reinterpret_cast<const void*>(&ffn7_kernel), dim3(unsigned(blocks)), dim3(unsigned(32 * (f.nw + 1))),
                     uint32_t(f.smem), a);
}

}  // namespace bonsai::cuda
