// Decode attention of one query row with its K / V rows through a bulk-copy ring in shared memory (round 23).
//
// Why: attention_kernel (mixers.cu) loads each warp's next K / V rows into registers one step ahead and reduces every
// (position, head) score across the warp (5 shuffles); at long contexts each step waits a DRAM round trip and issues
// ~40 instructions a (position, head) (8k context: ~47 us a layer for the 67 MB of fp32 K / V, ~30 % of the read
// probe). Here a block per (split, KV head) holds all G query heads (each row is read once, not once per head group);
// its producer warp keeps kRingStages tiles of 32 positions in flight (~194 KB per SM at D = 256), one bulk copy of a
// row per lane, and the consumer warps split the work by dimension slices, so no score needs a warp reduction:
//   A  warp w < D / 32: lane t's partial scores of tile position t over dims w*32 .. w*32 + 31, every head (s_part)
//   B  warp h < G: head h's scores (the sum of the slices), the tile's softmax update (s_p, s_corr; the running
//      max and sum stay in warp h's registers)
//   C  warp w < D / 32: lane d = w*32 + lane's output dim, acc[h] = acc[h] * corr + sum_t p[h][t] V[t][d]
// ~20 warp instructions a (position, head), two consumer barriers a tile. The end (the split partials, the last
// block's merge) is the shared attn_merge, with one "warp" (the block's state is already one softmax).
#include "backend/cuda/attn_decode.cuh"
#include "backend/cuda/mbarrier.cuh"

namespace bonsai::cuda {

namespace {

constexpr int kRingConsumers = 8;  // consumer warps (the producer is warp kRingConsumers): a dim slice each, a head each
constexpr int kRingTile = 32;      // positions a stage: one per lane
constexpr int kRingStages = 3;     // 3 x 32 x (260 + 256) floats = 194 KB at D = 256
constexpr int kRingThreads = (kRingConsumers + 1) * 32;
constexpr int kRingG = int(kAttnMaxGroup);
static_assert(kRingConsumers * 32 >= kAttnMaxDim, "a consumer warp per 32-dim slice");
static_assert(kRingConsumers >= kAttnMaxGroup, "a consumer warp per query head (phase B)");

// K rows sit kRingKPad floats apart beyond D: lane t reads row t, and the shift puts a quarter warp's 16-byte reads
// of 8 rows on 8 distinct bank quads. Floats of one stage: K [kRingTile][D + kRingKPad], then V [kRingTile][D].
constexpr int kRingKPad = 4;
__host__ __device__ constexpr int64_t ring_stage_floats(int64_t D) { return kRingTile * (2 * D + kRingKPad); }
uint32_t ring_smem(int64_t D) { return uint32_t(kRingStages * ring_stage_floats(D) * sizeof(float)); }

__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kRingConsumers * 32) : "memory");  // the producer never waits here
}

__global__ __launch_bounds__(kRingThreads) void attention_ring_kernel(const AttnArgs a) {
  extern __shared__ __align__(16) float ring[];  // [kRingStages][stage]; after the loop s_acc [G][D]
  __shared__ uint64_t full[kRingStages], empty[kRingStages];
  __shared__ __align__(16) float s_q[kRingG][kAttnMaxDim];                   // the G query rows, times scale
  __shared__ __align__(16) float s_part[kRingConsumers][kRingG][kRingTile];  // A: scores per dim slice
  __shared__ __align__(16) float s_p[kRingG][kRingTile];                     // B: the tile's probabilities
  __shared__ float s_corr[kRingG];                                           // B: exp(old max - new max)
  __shared__ float s_ml[1][kRingG][2];                                       // the block's max and sum per head
  __shared__ bool last;
  const int split = blockIdx.x, kvh = blockIdx.y;
  const int G = int(a.Hq / a.Hkv), E = int(a.D / 32), D = int(a.D), KS = D + kRingKPad;
  const int64_t h0 = int64_t(kvh) * G;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int S = a.splits;
  const int64_t T = a.p0 + 1;  // positions visible to the query row
  const int64_t per = (T + S - 1) / S;
  const int64_t t_begin = int64_t(split) * per, t_end = min(T, t_begin + per);
  const int n_tiles = t_end > t_begin ? int((t_end - t_begin + kRingTile - 1) / kRingTile) : 0;
  const int64_t stage = ring_stage_floats(D);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kRingStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], unsigned(kRingConsumers));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  pdl_trigger();
  pdl_wait();  // q and the newest K / V row come from the kernel before (attn_prep)
  for (int idx = threadIdx.x; idx < G * D; idx += kRingThreads)
    s_q[idx / D][idx % D] = a.q[(h0 + idx / D) * a.D + idx % D] * a.scale;
  __syncthreads();

  float acc[kRingG];                          // C: warp w < E, output dim w*32 + lane of each head
  float m_run = -INFINITY, l_run = 0.f;       // B: warp h < G, head h's running max and sum (all lanes)
  if (warp == kRingConsumers) {  // ---- producer: lane t copies K row t0 + t and V row t0 + t
    for (int i = 0; i < n_tiles; ++i) {
      const int s = i % kRingStages;
      if (i >= kRingStages) mbar_wait(&empty[s], uint32_t((i / kRingStages - 1) & 1));  // tile i - ST consumed
      const int64_t t0 = t_begin + int64_t(i) * kRingTile;
      const int rows = int(min(int64_t(kRingTile), t_end - t0));
      if (lane == 0) mbar_expect_tx(&full[s], unsigned(2 * rows * D) * unsigned(sizeof(float)));
      __syncwarp();
      if (lane < rows) {
        // the consumers' generic reads of this stage (seen through `empty`) before the async copies over it
        if (a.fence == 1) proxy_fence();
        const int64_t row = ((t0 + lane) * a.Hkv + kvh) * a.D;
        float* st = ring + s * stage;
        bulk_load(st + lane * KS, a.k + row, unsigned(D) * unsigned(sizeof(float)), &full[s]);
        bulk_load(st + kRingTile * KS + lane * D, a.v + row, unsigned(D) * unsigned(sizeof(float)), &full[s]);
      }
    }
  } else {  // ---- consumers
#pragma unroll
    for (int h = 0; h < kRingG; ++h) acc[h] = 0.f;
    for (int i = 0; i < n_tiles; ++i) {
      const int s = i % kRingStages;
      mbar_wait(&full[s], uint32_t((i / kRingStages) & 1));
      const int rows = int(min(int64_t(kRingTile), t_end - (t_begin + int64_t(i) * kRingTile)));
      const float* ks = ring + s * stage;  // [kRingTile][KS]
      const float* vs = ks + kRingTile * KS;  // [kRingTile][D]
      if (a.fence == 3) {  // probe: the stream alone
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
        continue;
      }
      if (warp < E) {  // A. A row past `rows` holds stale floats (finite or not): B drops its scores by selection.
        float sc[kRingG];
#pragma unroll
        for (int h = 0; h < kRingG; ++h) sc[h] = 0.f;
        const float4* kr = reinterpret_cast<const float4*>(ks + lane * KS + warp * 32);
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          const float4 kv = kr[c];
#pragma unroll
          for (int h = 0; h < kRingG; ++h) {
            if (h < G) {
              const float4 qv = reinterpret_cast<const float4*>(&s_q[h][warp * 32])[c];  // a broadcast
              sc[h] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
            }
          }
        }
#pragma unroll
        for (int h = 0; h < kRingG; ++h)
          if (h < G) s_part[warp][h][lane] = sc[h];
      }
      consumers_sync();
      if (warp < G) {  // B (every tile has a valid position 0: the new max is finite)
        float sc = -INFINITY;
        if (lane < rows) {
          sc = 0.f;
          for (int w = 0; w < E; ++w) sc += s_part[w][warp][lane];
        }
        const float m_new = fmaxf(m_run, warp_max(sc));
        const float corr = __expf(m_run - m_new);  // m_run = -inf on the first tile: 0
        const float p = lane < rows ? __expf(sc - m_new) : 0.f;
        l_run = l_run * corr + warp_sum(p);
        m_run = m_new;
        s_p[warp][lane] = p;
        if (lane == 0) s_corr[warp] = corr;
      }
      consumers_sync();
      if (warp < E) {  // C. p = 0 past `rows`, and the stale V there is replaced by 0 (0 x NaN would be NaN)
        const int d = warp * 32 + lane;
#pragma unroll
        for (int h = 0; h < kRingG; ++h) acc[h] *= h < G ? s_corr[h] : 1.f;
        for (int t = 0; t < rows; t += 4) {
          float v[4];
#pragma unroll
          for (int u = 0; u < 4; ++u) v[u] = t + u < rows ? vs[(t + u) * D + d] : 0.f;
#pragma unroll
          for (int h = 0; h < kRingG; ++h) {
            if (h < G) {
              const float4 p4 = *reinterpret_cast<const float4*>(&s_p[h][t]);  // a broadcast
              acc[h] += p4.x * v[0] + p4.y * v[1] + p4.z * v[2] + p4.w * v[3];
            }
          }
        }
      }
      if (a.fence == 2) proxy_fence();  // this lane's reads of the stage before the producer's async copies over it
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);  // this warp is done with the stage: the producer may refill it
    }
  }
  __syncthreads();  // every consumer is past its last tile (and every copy landed): the ring becomes s_acc
  if (warp < G && lane == 0) {
    s_ml[0][warp][0] = m_run;
    s_ml[0][warp][1] = l_run;
  }
  if (warp < E) {
#pragma unroll
    for (int h = 0; h < kRingG; ++h)
      if (h < G) ring[h * D + warp * 32 + lane] = acc[h];
  }
  __syncthreads();
  attn_merge<1, kRingG, kRingThreads>(a, s_ml, ring, G, 0, h0, split, blockIdx.y, &last);
}

}  // namespace

bool attention_ring_supported(const AttnDesc& d) {
  return !d.rows && d.M == 1 && aligned16(d.k) && aligned16(d.v) && d.D % 32 == 0 && d.D <= kAttnMaxDim &&
         d.Hq / d.Hkv <= kAttnMaxGroup;
}

Launch attention_ring_launch(const AttnDesc& d) {
  const AttnArgs a{d.q,  d.k,     d.v,   d.out,     d.part_o, d.part_ml, d.counters,         1,
                   d.p0, d.Hq,    d.Hkv, d.D,       d.splits, d.scale,   1 /* hsplit */, proxy_fence_mode()};
  return make_launch(reinterpret_cast<const void*>(&attention_ring_kernel), dim3(unsigned(d.splits), unsigned(d.Hkv)),
                     dim3(kRingThreads), ring_smem(d.D), a);
}

void init_attention_ring_attributes() {
  cudaFuncSetAttribute(reinterpret_cast<const void*>(&attention_ring_kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                       int(ring_smem(kAttnMaxDim)));
}

}  // namespace bonsai::cuda
