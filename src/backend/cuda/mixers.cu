// Causal GQA attention: decode (flash-decoding splits, merged by the last block) and the fp32 prefill tiles (round 8b;
// the tensor-core prefill is attn_prefill_mma.cu). The Gated DeltaNet delta rule, the other token mixer, is
// delta_rule.cu (token by token) and delta_chunk.cu (chunked).
#include <algorithm>
#include <cmath>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/common.cuh"

namespace bonsai::cuda {

void init_attn_prefill_attributes();  // below, with its kernel
void init_attn_prefill_mma_attributes();  // attn_prefill_mma.cu

// ================================ attention ========================================================

namespace {

// Warps per block: 8 for a single decode row (round 6: its 32 x Hkv blocks are all the parallelism there
// is, so each walks its split's positions 8 at a time), 4 for prefill chunks and batched rows (M rows
// already fill the SMs; 8 warps measured pp2048 2,028 vs 2,091 tok/s there: a longer in-block merge).
constexpr int kAttnWarpsDecode = 8, kAttnWarpsRows = 4;
constexpr int kAttnE = int(kAttnMaxDim / 32);  // dims per lane (lane holds dims lane + 32 e)
constexpr int kAttnG = int(kAttnMaxGroup);
constexpr int kMaxSplits = int(kAttnMaxSplits);

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
  int32_t pad_;
};
using AttnRowsArgs = WithRows<AttnArgs>;  // batched decode: per-row caches and positions

// P positions per warp step (1 or 2): with 2, the two positions' dot products and warp reductions are independent
// and interleave (the loop is latency-bound: a 5-shuffle reduction per position and query head), and one softmax
// rescale serves both. P = 1 is the round-6 loop exactly.
// GM: the most query heads a block holds (the register arrays' size): kAttnG, or 2 for long contexts split over more
// blocks per KV head (AttnDesc::hsplit = G / 2; round 14): 244 registers a thread at GM = kAttnG (8) leave one block
// per SM, 128 at GM = 2 two.
template <class Args, int kAttnWarps, int P, int GM = kAttnG>
__global__ __launch_bounds__(kAttnWarps * 32) void attention_kernel(const Args args) {
  constexpr bool kRows = is_rows_v<Args>;
  const AttnArgs& a = base_of(args);
  __shared__ float s_ml[kAttnWarps][GM][2];
  extern __shared__ float s_acc[];  // [kAttnWarps][G][D] each warp's partial output (attention_smem)
  __shared__ bool last;
  pdl_trigger();
  pdl_wait();
  const int split = blockIdx.x, kvh = blockIdx.y / a.hsplit;
  const int64_t m = blockIdx.z;
  const int S = a.splits;
  const int G = int(a.Hq / a.Hkv) / a.hsplit, E = int(a.D / 32), D = int(a.D);  // G: this block's query heads
  const int64_t h0 = int64_t(blockIdx.y) * G;  // its first query head (kvh * (Hq / Hkv) + its share)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float* kc = a.k;  // this row's caches [T, Hkv, D]
  const float* vc = a.v;
  int64_t T = a.p0 + m + 1;  // positions visible to query row m
  if constexpr (kRows) {
    kc = args.t.a[m];
    vc = args.t.b[m];
    T = args.t.pos[m] + 1;
  }
  const int64_t per = (T + S - 1) / S;
  const int64_t t_begin = int64_t(split) * per, t_end = min(T, t_begin + per);

  float qv[GM][kAttnE], acc[GM][kAttnE], mx[GM], l[GM];
#pragma unroll
  for (int hh = 0; hh < GM; ++hh) {
    mx[hh] = -INFINITY;
    l[hh] = 0.f;
#pragma unroll
    for (int e = 0; e < kAttnE; ++e) {
      acc[hh][e] = 0.f;
      qv[hh][e] = (hh < G && e < E) ? a.q[(m * a.Hq + h0 + hh) * a.D + lane + 32 * e] * a.scale : 0.f;
    }
  }
  // K/V rows one step ahead (the loop is latency-bound at decode: few blocks, dependent math). A warp step takes
  // positions t + j W (j < P, W warps).
  // Zero-filled: a position slot past the split's end is never loaded, and its p = 0 must not meet a garbage
  // register (0 x NaN); later slots past the end hold the last (finite) rows. Found on the H200 (round 9: M = 1
  // decode logits NaN with P = 2 before this).
  float kn[P][kAttnE] = {}, vn[P][kAttnE] = {};
  auto load_kv = [&](int64_t t, int j) {
    const float* kr = kc + (t * a.Hkv + kvh) * a.D;
    const float* vr = vc + (t * a.Hkv + kvh) * a.D;
#pragma unroll
    for (int e = 0; e < kAttnE; ++e) {
      kn[j][e] = e < E ? kr[lane + 32 * e] : 0.f;
      vn[j][e] = e < E ? vr[lane + 32 * e] : 0.f;
    }
  };
  constexpr int kStep = kAttnWarps * P;
#pragma unroll
  for (int j = 0; j < P; ++j)
    if (t_begin + warp + j * kAttnWarps < t_end) load_kv(t_begin + warp + j * kAttnWarps, j);
  for (int64_t t = t_begin + warp; t < t_end; t += kStep) {
    float kk[P][kAttnE], vv[P][kAttnE];
    bool valid[P];
#pragma unroll
    for (int j = 0; j < P; ++j) {
      valid[j] = t + j * kAttnWarps < t_end;
#pragma unroll
      for (int e = 0; e < kAttnE; ++e) {
        kk[j][e] = kn[j][e];
        vv[j][e] = vn[j][e];
      }
    }
#pragma unroll
    for (int j = 0; j < P; ++j)
      if (t + kStep + j * kAttnWarps < t_end) load_kv(t + kStep + j * kAttnWarps, j);
#pragma unroll
    for (int hh = 0; hh < GM; ++hh) {
      if (hh < G) {
        float s[P];
#pragma unroll
        for (int j = 0; j < P; ++j) {
          s[j] = 0.f;
#pragma unroll
          for (int e = 0; e < kAttnE; ++e) s[j] += qv[hh][e] * kk[j][e];
        }
#pragma unroll
        for (int j = 0; j < P; ++j) s[j] = warp_sum(s[j]);
        float mn = mx[hh];
#pragma unroll
        for (int j = 0; j < P; ++j)
          if (valid[j]) mn = fmaxf(mn, s[j]);
        const float corr = __expf(mx[hh] - mn);
        float p[P];
#pragma unroll
        for (int j = 0; j < P; ++j) p[j] = valid[j] ? __expf(s[j] - mn) : 0.f;
        float lsum = l[hh] * corr + p[0];
#pragma unroll
        for (int j = 1; j < P; ++j) lsum += p[j];
        l[hh] = lsum;
#pragma unroll
        for (int e = 0; e < kAttnE; ++e) {
          float av = acc[hh][e] * corr + p[0] * vv[0][e];
#pragma unroll
          for (int j = 1; j < P; ++j)
            if (valid[j]) av += p[j] * vv[j][e];
          acc[hh][e] = av;
        }
        mx[hh] = mn;
      }
    }
  }
#pragma unroll
  for (int hh = 0; hh < GM; ++hh) {
    if (hh < G) {
      if (lane == 0) {
        s_ml[warp][hh][0] = mx[hh];
        s_ml[warp][hh][1] = l[hh];
      }
#pragma unroll
      for (int e = 0; e < kAttnE; ++e)
        if (e < E) s_acc[(warp * G + hh) * D + lane + 32 * e] = acc[hh][e];
    }
  }
  __syncthreads();
  // Merge the warps: (M, L, A) of this split for each (head, dim).
  for (int idx = threadIdx.x; idx < G * D; idx += kAttnWarps * 32) {
    const int hh = idx / D, d = idx % D;
    float Mx = -INFINITY;
    for (int w = 0; w < kAttnWarps; ++w) Mx = fmaxf(Mx, s_ml[w][hh][0]);
    float L = 0.f, A = 0.f;
    if (Mx != -INFINITY) {
      for (int w = 0; w < kAttnWarps; ++w) {
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
  if (threadIdx.x == 0) last = atomicAdd(&a.counters[m * gridDim.y + blockIdx.y], 1) == S - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int idx = threadIdx.x; idx < G * D; idx += kAttnWarps * 32) {
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
  if (threadIdx.x == 0) a.counters[m * gridDim.y + blockIdx.y] = 0;  // ready for the next launch (graph replays)
}

// Dynamic shared memory of a launch: the warps' partial outputs, W x G x D floats (<= 64 KB).
uint32_t attention_smem(int W, int64_t G, int64_t D) { return uint32_t(W * G * D * sizeof(float)); }

}  // namespace

void init_attention_attributes() {
  const void* fs[] = {reinterpret_cast<const void*>(&attention_kernel<AttnArgs, kAttnWarpsDecode, 1>),
                      reinterpret_cast<const void*>(&attention_kernel<AttnArgs, kAttnWarpsDecode, 2>),
                      reinterpret_cast<const void*>(&attention_kernel<AttnArgs, kAttnWarpsDecode, 2, 2>),
                      reinterpret_cast<const void*>(&attention_kernel<AttnArgs, kAttnWarpsRows, 1>),
                      reinterpret_cast<const void*>(&attention_kernel<AttnRowsArgs, kAttnWarpsRows, 1>),
                      reinterpret_cast<const void*>(&attention_kernel<AttnRowsArgs, kAttnWarpsRows, 2>)};
  for (const void* f : fs)
    cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         int(attention_smem(kAttnWarpsDecode, kAttnMaxGroup, kAttnMaxDim)));
  init_attn_prefill_attributes();
  init_delta_chunk_attributes();
}

int attention_head_split(int64_t splits, int64_t Hkv, int64_t G, int sms) {
  int best = 1;
  for (int h = 1; h <= G; ++h)
    if (G % h == 0 && splits * Hkv * h <= sms) best = h;
  return best;
}

int attention_long_head_split(int64_t splits, int64_t G, int hsplit) {
  if (splits < kAttnLongSplits) return hsplit;
  for (int64_t h = std::max(1, hsplit); h <= G; ++h)
    if (G % h == 0 && G / h <= 2) return int(h);
  return hsplit;
}

Launch attention_launch(const AttnDesc& d) {
  const int hsplit = !d.rows && d.M == 1 ? d.hsplit : 1;
  AttnArgs a{d.q, d.k, d.v, d.out, d.part_o, d.part_ml, d.counters, d.M, d.p0, d.Hq, d.Hkv, d.D, d.splits, d.scale, hsplit, 0};
  const dim3 grid(unsigned(d.splits), unsigned(d.Hkv * hsplit), unsigned(d.M));
  const int64_t G = d.Hq / d.Hkv / hsplit;
  const bool pair = d.pairs == 2;
  if (d.rows) {
    AttnRowsArgs r{a, *d.rows};
    const void* f = pair ? reinterpret_cast<const void*>(&attention_kernel<AttnRowsArgs, kAttnWarpsRows, 2>)
                         : reinterpret_cast<const void*>(&attention_kernel<AttnRowsArgs, kAttnWarpsRows, 1>);
    return make_launch(f, grid, dim3(kAttnWarpsRows * 32), attention_smem(kAttnWarpsRows, G, d.D), r);
  }
  if (d.M == 1) {
    const void* f = G <= 2 && pair ? reinterpret_cast<const void*>(&attention_kernel<AttnArgs, kAttnWarpsDecode, 2, 2>)
                    : pair         ? reinterpret_cast<const void*>(&attention_kernel<AttnArgs, kAttnWarpsDecode, 2>)
                                   : reinterpret_cast<const void*>(&attention_kernel<AttnArgs, kAttnWarpsDecode, 1>);
    return make_launch(f, grid, dim3(kAttnWarpsDecode * 32), attention_smem(kAttnWarpsDecode, G, d.D), a);
  }
  return make_launch(reinterpret_cast<const void*>(&attention_kernel<AttnArgs, kAttnWarpsRows, 1>), grid,
                     dim3(kAttnWarpsRows * 32), attention_smem(kAttnWarpsRows, G, d.D), a);
}

// ================================ attention, prefill tiles (round 8b) ==============================
// Block = 32 query rows x one query head; the K / V of its KV head walked in tiles of 32 positions (causal: up
// to the block's last row), each tile staged in shared memory once for the 32 rows (the flash-decoding kernel
// above reads every position once per query row, one position per warp step with a warp reduction each).
// Thread (rg = tid / 16, cg = tid % 16): scores of rows 2 rg, 2 rg + 1 x positions cg, cg + 16; output of the
// same two rows x dims 4 cg + 64 k (k < D / 64). Online softmax per row (the 16 threads of a row hold the same
// running max / sum, reduced with shuffles inside the half warp). fp32 throughout, as the decode kernel.

namespace {

constexpr int kPaRows = 32, kPaCols = 32;
constexpr int kPaLd = int(kAttnMaxDim) + 4;  // float4 rows; 260 mod 32 = 4: eight rows of a quarter warp hit all banks
constexpr int kPaLdP = kPaCols + 1;

uint32_t attn_prefill_smem() { return uint32_t((3 * kPaRows * kPaLd + kPaRows * kPaLdP) * sizeof(float)); }

// RPT = query rows per thread: 2 (v1, 256 threads) or 4 (v2, 128 threads: each shared-memory read feeds twice the
// FMAs; v1 is bound by shared-memory wavefronts, ~6 per 16 FMA instructions in the scores).
template <int RPT>
__global__ __launch_bounds__(16 * kPaRows / RPT, 2) void attn_prefill_kernel(const AttnArgs a) {
  constexpr int kThr = 16 * kPaRows / RPT;
  extern __shared__ __align__(16) float sm[];
  float* Qs = sm;                    // [32][kPaLd] this block's query rows (scaled)
  float* Ks = Qs + kPaRows * kPaLd;  // [32][kPaLd] key tile
  float* Vs = Ks + kPaCols * kPaLd;  // [32][kPaLd] value tile
  float* Ps = Vs + kPaCols * kPaLd;  // [32][kPaLdP] probabilities of the tile
  pdl_trigger();
  pdl_wait();
  const int tid = threadIdx.x, rg = tid >> 4, cg = tid & 15;
  const int64_t h = blockIdx.y, kvh = h / (a.Hq / a.Hkv), m0 = int64_t(blockIdx.x) * kPaRows;
  const int D = int(a.D), D4 = D / 4;
  const int rb = RPT * rg, c0 = cg, c1 = cg + 16;  // rows rb .. rb + RPT - 1; positions c0, c1 of each tile
  const int64_t qp = a.p0 + m0 + rb;              // query position of row rb
  const int64_t qlast = a.p0 + min(m0 + kPaRows, a.M) - 1;
  const int ntiles = int(qlast / kPaCols) + 1;
  constexpr int kK = int(kAttnMaxDim) / 64;
  float o[RPT][kK][4] = {};
  float mx[RPT], l[RPT];
#pragma unroll
  for (int e = 0; e < RPT; ++e) {
    mx[e] = -INFINITY;
    l[e] = 0.f;
  }
  // K / V tiles by cp.async (zero-filled past qlast), in flight while the block computes: K(t + 1) is issued once
  // the scores of tile t are done, V(t + 1) once its P V is done (one commit group each, completed in order).
  auto issue = [&](float* dst, const float* src, int64_t pbase) {
    for (int idx = tid; idx < kPaCols * D4; idx += kThr) {
      const int r = idx / D4, d4 = idx % D4;
      const int64_t pos = pbase + r;
      const bool ok = pos <= qlast;
      cp_async16(dst + r * kPaLd + 4 * d4, src + ((ok ? pos : 0) * a.Hkv + kvh) * a.D + 4 * d4, ok ? 16 : 0);
    }
    cp_async_commit();
  };
  issue(Ks, a.k, 0);
  issue(Vs, a.v, 0);
  for (int idx = tid; idx < kPaRows * D4; idx += kThr) {
    const int r = idx / D4, d4 = idx % D4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (m0 + r < a.M) {
      v = *reinterpret_cast<const float4*>(a.q + ((m0 + r) * a.Hq + h) * a.D + 4 * d4);
      v.x *= a.scale, v.y *= a.scale, v.z *= a.scale, v.w *= a.scale;
    }
    *reinterpret_cast<float4*>(Qs + r * kPaLd + 4 * d4) = v;
  }
  for (int tile = 0; tile < ntiles; ++tile) {
    const int64_t pbase = int64_t(tile) * kPaCols;
    cp_async_wait<1>();  // K(tile) has landed (V(tile) may still be in flight)
    __syncthreads();     // ... for every thread's copies; Q is written (tile 0)
    float s0[RPT], s1[RPT];
#pragma unroll
    for (int e = 0; e < RPT; ++e) s0[e] = s1[e] = 0.f;
    for (int d4 = 0; d4 < D4; ++d4) {
      const float4 k0 = *reinterpret_cast<const float4*>(Ks + c0 * kPaLd + 4 * d4);
      const float4 k1 = *reinterpret_cast<const float4*>(Ks + c1 * kPaLd + 4 * d4);
#pragma unroll
      for (int e = 0; e < RPT; ++e) {
        const float4 q = *reinterpret_cast<const float4*>(Qs + (rb + e) * kPaLd + 4 * d4);
        s0[e] += q.x * k0.x + q.y * k0.y + q.z * k0.z + q.w * k0.w;
        s1[e] += q.x * k1.x + q.y * k1.y + q.z * k1.z + q.w * k1.w;
      }
    }
    const int64_t pc0 = pbase + c0, pc1 = pbase + c1;
    // Tile 0 holds position 0 <= every query position, so the running max is finite from the first tile on;
    // a row with no visible position in a later tile keeps its max (its probabilities there are 0).
#pragma unroll
    for (int e = 0; e < RPT; ++e) {
      if (pc0 > qp + e) s0[e] = -INFINITY;
      if (pc1 > qp + e) s1[e] = -INFINITY;
      float t = fmaxf(s0[e], s1[e]);
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, off));
      const float n = fmaxf(mx[e], t), f = __expf(mx[e] - n);
      const float p0 = __expf(s0[e] - n), p1 = __expf(s1[e] - n);
      float u = p0 + p1;
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) u += __shfl_xor_sync(0xffffffffu, u, off);
      l[e] = l[e] * f + u;
      mx[e] = n;
#pragma unroll
      for (int k = 0; k < kK; ++k)
#pragma unroll
        for (int c = 0; c < 4; ++c) o[e][k][c] *= f;
      Ps[(rb + e) * kPaLdP + c0] = p0;
      Ps[(rb + e) * kPaLdP + c1] = p1;
    }
    cp_async_wait<0>();  // V(tile)
    __syncthreads();     // P and V visible; every thread is done with Ks
    if (tile + 1 < ntiles) issue(Ks, a.k, pbase + kPaCols);
    else cp_async_commit();  // an empty group keeps the wait<1> count above right
    const int jn = int(min(int64_t(kPaCols), qlast + 1 - pbase));  // positions of the tile that anyone sees
    for (int j = 0; j < jn; ++j) {
      float w[RPT];
#pragma unroll
      for (int e = 0; e < RPT; ++e) w[e] = Ps[(rb + e) * kPaLdP + j];
#pragma unroll
      for (int k = 0; k < kK; ++k) {
        const int d = 4 * cg + 64 * k;
        if (d < D) {
          const float4 v = *reinterpret_cast<const float4*>(Vs + j * kPaLd + d);
#pragma unroll
          for (int e = 0; e < RPT; ++e) {
            o[e][k][0] += w[e] * v.x;
            o[e][k][1] += w[e] * v.y;
            o[e][k][2] += w[e] * v.z;
            o[e][k][3] += w[e] * v.w;
          }
        }
      }
    }
    __syncthreads();  // every thread is done with Vs and Ps
    if (tile + 1 < ntiles) issue(Vs, a.v, pbase + kPaCols);
    else cp_async_commit();
  }
#pragma unroll
  for (int e = 0; e < RPT; ++e) {
    const float inv = 1.f / l[e];
    if (m0 + rb + e >= a.M) continue;
#pragma unroll
    for (int k = 0; k < kK; ++k) {
      const int d = 4 * cg + 64 * k;
      if (d < D)
        *reinterpret_cast<float4*>(a.out + ((m0 + rb + e) * a.Hq + h) * a.D + d) =
            make_float4(o[e][k][0] * inv, o[e][k][1] * inv, o[e][k][2] * inv, o[e][k][3] * inv);
    }
  }
}

}  // namespace

void init_attn_prefill_attributes() {
  for (const void* f : {reinterpret_cast<const void*>(&attn_prefill_kernel<2>),
                        reinterpret_cast<const void*>(&attn_prefill_kernel<4>)})
    cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, int(attn_prefill_smem()));
  init_attn_prefill_mma_attributes();
}

Launch attention_prefill_launch(const AttnDesc& d, int version) {
  AttnArgs a{d.q, d.k, d.v, d.out, nullptr, nullptr, nullptr, d.M, d.p0, d.Hq, d.Hkv, d.D, 1, d.scale, 1, 0};
  const dim3 grid(unsigned((d.M + kPaRows - 1) / kPaRows), unsigned(d.Hq));
  if (version == 2)
    return make_launch(reinterpret_cast<const void*>(&attn_prefill_kernel<4>), grid, dim3(16 * kPaRows / 4),
                       attn_prefill_smem(), a);
  return make_launch(reinterpret_cast<const void*>(&attn_prefill_kernel<2>), grid, dim3(16 * kPaRows / 2),
                     attn_prefill_smem(), a);
}

}  // namespace bonsai::cuda
