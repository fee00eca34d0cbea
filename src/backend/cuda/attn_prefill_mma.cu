// Prefill attention on the tensor cores (round 12): the causal GQA attention of one prefill chunk (M query rows at
// positions p0 .. p0 + M - 1 over the fp32 KV cache [T, Hkv, D]) with mma.sync m16n8k16 f16 -> f32, flash-attention
// style (online softmax in fp32). Replaces attn_prefill_kernel<4> (mixers.cu, fp32 FFMA) where
// Options::attn_prefill_mma says so.
//
// Block = one KV head x 8 query positions x all G query heads of that KV head: the K / V tile of 32 positions is
// staged once in shared memory for all of them. Warp (pair, quarter): mma rows 0-7 are the 8 positions of head
// 2 pair, rows 8-15 the same positions of head 2 pair + 1 (so the two rows a thread holds share one query position,
// one causal mask); the head dims are cut in 16-dim groups and the warp owns groups quarter, quarter + 4, ...
//   - scores: each warp multiplies its groups only (Q of its groups in registers for the whole call) and the 4
//     warps of a pair add their 16 x 32 partial scores through shared memory, in quarter order: all 4 hold the
//     same scores, so the same softmax, with no second exchange;
//   - P V: each warp the full P (its score accumulators, re-packed as A fragments) times V of its groups.
// Precision: kSplit = true writes every fp32 operand x as hi + lo, hi = f16(x), lo = f16(x - hi), and each product as
// hi*hi + hi*lo + lo*hi (3 mmas; the dropped lo*lo is ~2^-22 of it): fp32-level results. kSplit = false: hi only.
// Each tile's P V goes into a fresh accumulator, added to the output in fp32 (o = o f + tile): the tensor cores'
// fp32 accumulation truncates, and ~900 mmas into one accumulator over a 5,000-position context drifted to 2.1e-5 of
// max |out| (device call 1), where the fp32 kernel's round-to-nearest FFMAs stay at ~2e-6.
#include <cmath>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/common.cuh"

namespace bonsai::cuda {

namespace {

constexpr int kPos = 8;                               // query positions per block
constexpr int kKeys = 32;                             // key positions per tile
constexpr int kQuarters = 4;                          // warps per head pair
constexpr int kPairs = int(kAttnMaxGroup + 1) / 2;    // head pairs per block at most
constexpr int kWarps = kPairs * kQuarters;            // warps per block at most
constexpr int kGroups = int(kAttnMaxDim) / 16 / kQuarters;  // 16-dim groups per warp at most
constexpr int kLdH = int(kAttnMaxDim) + 8;  // halves per K / V row: 528 B, so an ldmatrix's 8 rows hit 8 bank groups

struct MmaArgs {
  const float* q;  // [M][Hq][D]
  const float* k;  // [T][Hkv][D] the KV cache, T >= p0 + M
  const float* v;  // [T][Hkv][D]
  float* out;      // [M][Hq][D]
  int64_t M, p0, Hq, Hkv, D;
  float scale;
  int32_t pad_;
  const __half* planes;  // PRE instances: [Hkv][4][tp][D] K hi, K lo, V hi, V lo (kv_planes_kernel), else null
  int64_t tp;            // positions per plane (>= p0 + M)
};

// Dynamic shared memory: fp32 stage [2][kKeys][kAttnMaxDim] (K then V of the next tile, cp.async) + f16 planes
// [4][kKeys][kLdH] (K hi, K lo, V hi, V lo) + partial scores [kWarps][16 regs][32 lanes] float.
constexpr uint32_t kStageBytes = 2 * kKeys * uint32_t(kAttnMaxDim) * 4;
constexpr uint32_t kPlaneBytes = 4 * kKeys * kLdH * 2;
constexpr uint32_t kPartBytes = kWarps * 16 * 32 * 4;
constexpr uint32_t kSmemBytes = kStageBytes + kPlaneBytes + kPartBytes;

__device__ __forceinline__ uint32_t pack_half2(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

// (x, y) -> hi = f16(x, y) (x in the low half: the lower column of a fragment), lo = f16 of the remainders.
__device__ __forceinline__ void split2(float x, float y, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(x, y);
  const float2 hf = __half22float2(h);
  hi = pack_half2(h);
  lo = pack_half2(__floats2half2_rn(x - hf.x, y - hf.y));
}

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// "memory": the planes are rewritten between barriers; the loads must stay between them.
__device__ __forceinline__ void ldsm_x4(uint32_t (&d)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&d)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(addr) : "memory");
}

// Round 18 (PRE instances): the K / V of the chunk's window as f16 hi / lo planes in global memory, written once per
// launch by kv_planes_kernel with the same split2 as the per-block conversion (so bit-identical operands): each block
// copies its tiles' planes straight into shared memory, two tiles in flight (no fp32 stage, no conversion, one barrier
// per tile instead of two). Without it every block converted every tile it read: at M = 2048 up to 256 blocks per KV
// head converted the same tile.
constexpr uint32_t kPreSmemBytes = 2 * kPlaneBytes + kPartBytes;

// K and V rows [0, T) of the cache -> planes [Hkv][4][tp][D] (K hi, K lo, V hi, V lo): one float4 a thread.
struct PlanesArgs {
  const float* k;  // [T][Hkv][D]
  const float* v;  // [T][Hkv][D]
  __half* planes;  // [Hkv][4][tp][D]
  int64_t T, Hkv, D, tp;
};
__global__ void kv_planes_kernel(const PlanesArgs a) {
  pdl_trigger();
  pdl_wait();
  const float *k = a.k, *v = a.v;
  __half* planes = a.planes;
  const int64_t T = a.T, Hkv = a.Hkv, D = a.D, tp = a.tp;
  const int64_t D4 = D / 4, n = T * Hkv * D4;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d4 = i % D4, h = (i / D4) % Hkv, pos = i / (D4 * Hkv);
    const int64_t src = (pos * Hkv + h) * D + 4 * d4;
    __half* base = planes + (h * 4 * tp + pos) * D + 4 * d4;
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
      const float4 x = *reinterpret_cast<const float4*>((kv ? v : k) + src);
      uint2 hi, lo;
      split2(x.x, x.y, hi.x, lo.x);
      split2(x.z, x.w, hi.y, lo.y);
      *reinterpret_cast<uint2*>(base + (2 * kv) * tp * D) = hi;
      *reinterpret_cast<uint2*>(base + (2 * kv + 1) * tp * D) = lo;
    }
  }
}

// kMaxPairs: head pairs the launch bound allows, 3 (G <= 6: 384 threads, up to 168 registers) or kPairs (G <= 8:
// 512 threads, 128 registers: a few spilled). PRE: the operands from kv_planes_kernel's planes (above).
template <bool kSplit, int kMaxPairs, bool PRE = false>
__global__ __launch_bounds__(kMaxPairs * kQuarters * 32, 1) void attn_prefill_mma_kernel(const MmaArgs a) {
  extern __shared__ __align__(16) unsigned char sm[];
  // Not PRE: fp32 stage [2][kKeys][D] | planes [4][kKeys][kLdH] | partial scores. PRE: planes [2 tiles][4][kKeys][kLdH]
  // | partial scores.
  float* stage = reinterpret_cast<float*>(sm);                      // [2][kKeys][D] fp32 K, V of the next tile
  __half* planes = reinterpret_cast<__half*>(sm + (PRE ? 0 : kStageBytes));  // [4][kKeys][kLdH] K hi, K lo, V hi, V lo
  float* part = reinterpret_cast<float*>(sm + (PRE ? 2 * kPlaneBytes : kStageBytes + kPlaneBytes));  // [kWarps][16][32]
  pdl_trigger();
  pdl_wait();
  const int tid = threadIdx.x, nthr = blockDim.x, warp = tid >> 5, lane = tid & 31;
  const int pair = warp / kQuarters, quarter = warp % kQuarters;
  const int G = int(a.Hq / a.Hkv), D = int(a.D), ngroups = D / 16, D4 = D / 4;
  const int64_t kvh = blockIdx.y, m0 = int64_t(blockIdx.x) * kPos;
  const int r = lane >> 2, c2 = 2 * (lane & 3);  // fragment row r (and r + 8), columns c2, c2 + 1
  const int64_t qpos = a.p0 + m0 + r;            // query position of both of this thread's rows
  const int64_t qlast = a.p0 + min(m0 + kPos, a.M) - 1;
  const int ntiles = int(qlast / kKeys) + 1;
  // Rows r -> head 2 pair, r + 8 -> head 2 pair + 1; a row past M or past G stays zero and is not written.
  const bool rowA = m0 + r < a.M && 2 * pair < G, rowB = m0 + r < a.M && 2 * pair + 1 < G;
  const int64_t hA = kvh * G + 2 * pair, hB = hA + 1;

  // K / V tile -> stage by cp.async, positions past qlast zero-filled (masked anyway; zero keeps 0 * V finite).
  // The tile's 2 x kKeys rows (K then V) go to the warps in turn, a row's float4s to the lanes: no index division
  // (a flat index split by runtime divisions cost ~2,000 instructions per thread and tile: device call 2).
  const int nwarps = nthr >> 5;
  const int64_t pos_stride = a.Hkv * a.D;  // floats from one cache position to the next
  const float* kbase = a.k + kvh * a.D;
  const float* vbase = a.v + kvh * a.D;
  auto issue = [&](int tile) {
    if constexpr (PRE) {  // tile -> plane buffer tile & 1: 4 (hi only: 2) planes x kKeys rows, 16 B a lane
      const int np = kSplit ? 4 : 2, D8 = D / 8;
      __half* buf = planes + (tile & 1) * 4 * kKeys * kLdH;
      for (int row = warp; row < np * kKeys; row += nwarps) {
        const int pl = kSplit ? row / kKeys : 2 * (row / kKeys), key = row % kKeys;
        const int64_t pos = int64_t(tile) * kKeys + key;
        const bool ok = pos <= qlast;
        const __half* src = a.planes + ((kvh * 4 + pl) * a.tp + (ok ? pos : 0)) * a.D;
        for (int d8 = lane; d8 < D8; d8 += 32)
          cp_async16(buf + (pl * kKeys + key) * kLdH + 8 * d8, src + 8 * d8, ok ? 16 : 0);
      }
      cp_async_commit();
      return;
    }
    for (int row = warp; row < 2 * kKeys; row += nwarps) {
      const int key = row % kKeys;
      const int64_t pos = int64_t(tile) * kKeys + key;
      const bool ok = pos <= qlast;
      const float* src = (row < kKeys ? kbase : vbase) + (ok ? pos : 0) * pos_stride;
      for (int d4 = lane; d4 < D4; d4 += 32) cp_async16(stage + row * D + 4 * d4, src + 4 * d4, ok ? 16 : 0);
    }
    cp_async_commit();
  };
  issue(0);

  // Q fragments of this warp's groups (A operand, rows r / r + 8, dims 16 g + c2 (+1) and + 8), scaled.
  uint32_t qh[kGroups][4], ql[kGroups][4];
#pragma unroll
  for (int i = 0; i < kGroups; ++i) {
    const int g = quarter + kQuarters * i;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool rowb = j & 1, ok = g < ngroups && (rowb ? rowB : rowA);
      float2 x = make_float2(0.f, 0.f);
      if (ok) {
        x = *reinterpret_cast<const float2*>(a.q + ((m0 + r) * a.Hq + (rowb ? hB : hA)) * a.D + 16 * g + c2 +
                                             (j >= 2 ? 8 : 0));
        x.x *= a.scale, x.y *= a.scale;
      }
      split2(x.x, x.y, qh[i][j], ql[i][j]);
    }
  }

  float o[kGroups][2][4] = {};  // [group][8-dim block][C fragment] unnormalised output
  float mA = -INFINITY, mB = -INFINITY, lA = 0.f, lB = 0.f;  // running max; this thread's columns' sum
  const uint32_t planes_s0 = uint32_t(__cvta_generic_to_shared(planes));
  constexpr uint32_t kPlane = kKeys * kLdH * 2;  // bytes per plane
  // ldmatrix row addresses: lane l gives row l % 8 of matrix l / 8.
  //  K (scores, B = K^T): matrices [keys 0-7][dims 0-7], [0-7][8-15], [8-15][0-7], [8-15][8-15] of an n-block pair
  //  V (P V, B = V, transposed load): [keys 0-7][dims 0-7], [8-15][0-7], [0-7][8-15], [8-15][8-15] of a k-step
  const uint32_t k_lane = uint32_t(((lane & 7) + (lane >> 4) * 8) * kLdH + ((lane >> 3) & 1) * 8) * 2;
  const uint32_t v_lane = uint32_t(((lane & 7) + ((lane >> 3) & 1) * 8) * kLdH + (lane >> 4) * 8) * 2;

  for (int tile = 0; tile < ntiles; ++tile) {
    cp_async_wait<0>();
    __syncthreads();  // the stage is complete; every warp is done with the planes and partial scores of tile - 1
    const uint32_t planes_s = planes_s0 + (PRE ? uint32_t(tile & 1) * 4 * kPlane : 0u);
    if constexpr (PRE) {
      if (tile + 1 < ntiles) issue(tile + 1);  // into the other buffer: tile - 1's, which every warp is done with
    } else {
    for (int row = warp; row < 2 * kKeys; row += nwarps) {
      // stage row (K rows 0 .. kKeys - 1, then V) -> its hi plane (0: K, 2: V) and the lo plane after it
      __half* dst = planes + (row < kKeys ? row : row + kKeys) * kLdH;
      for (int d4 = lane; d4 < D4; d4 += 32) {
        const float4 x = *reinterpret_cast<const float4*>(stage + row * D + 4 * d4);
        uint2 hi, lo;
        split2(x.x, x.y, hi.x, lo.x);
        split2(x.z, x.w, hi.y, lo.y);
        *reinterpret_cast<uint2*>(dst + 4 * d4) = hi;
        if (kSplit) *reinterpret_cast<uint2*>(dst + kKeys * kLdH + 4 * d4) = lo;
      }
    }
    __syncthreads();  // planes written; the stage is free
    if (tile + 1 < ntiles) issue(tile + 1);
    }

    // Partial scores over this warp's groups: s[n-block of 8 keys][C fragment].
    float s[4][4] = {};
#pragma unroll
    for (int i = 0; i < kGroups; ++i) {
      const int g = quarter + kQuarters * i;
      if (g >= ngroups) break;
#pragma unroll
      for (int nb = 0; nb < 4; nb += 2) {
        const uint32_t addr = planes_s + k_lane + uint32_t((nb * 8 * kLdH + 16 * g) * 2);
        uint32_t kh[4];
        ldsm_x4(kh, addr);
        mma16816(s[nb], qh[i], kh[0], kh[1]);
        mma16816(s[nb + 1], qh[i], kh[2], kh[3]);
        if (kSplit) {
          uint32_t kl[4];
          ldsm_x4(kl, addr + kPlane);
          mma16816(s[nb], qh[i], kl[0], kl[1]);
          mma16816(s[nb + 1], qh[i], kl[2], kl[3]);
          mma16816(s[nb], ql[i], kh[0], kh[1]);
          mma16816(s[nb + 1], ql[i], kh[2], kh[3]);
        }
      }
    }
    // The pair's 4 partials, through shared memory (same fragment layout in every warp: [reg][lane] float4s).
    float4* mine = reinterpret_cast<float4*>(part + warp * 512);
#pragma unroll
    for (int nb = 0; nb < 4; ++nb) mine[nb * 32 + lane] = make_float4(s[nb][0], s[nb][1], s[nb][2], s[nb][3]);
    asm volatile("bar.sync %0, %1;" ::"r"(1 + pair), "r"(kQuarters * 32) : "memory");
    const float4* pp = reinterpret_cast<const float4*>(part + pair * kQuarters * 512);
#pragma unroll
    for (int nb = 0; nb < 4; ++nb) {
      float4 t = pp[nb * 32 + lane];
#pragma unroll
      for (int qq = 1; qq < kQuarters; ++qq) {
        const float4 u = pp[qq * 128 + nb * 32 + lane];
        t.x += u.x, t.y += u.y, t.z += u.z, t.w += u.w;
      }
      s[nb][0] = t.x, s[nb][1] = t.y, s[nb][2] = t.z, s[nb][3] = t.w;
    }
    // Causal mask and online softmax (rows A = r: c 0, 1; B = r + 8: c 2, 3). Tile 0 holds position 0 <= every
    // query position, so the running max is finite from the first tile on.
    const int64_t pbase = int64_t(tile) * kKeys + c2;
    float tA = -INFINITY, tB = -INFINITY;
#pragma unroll
    for (int nb = 0; nb < 4; ++nb)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        if (pbase + 8 * nb + c > qpos) s[nb][c] = s[nb][c + 2] = -INFINITY;
        tA = fmaxf(tA, s[nb][c]);
        tB = fmaxf(tB, s[nb][c + 2]);
      }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
      tA = fmaxf(tA, __shfl_xor_sync(0xffffffffu, tA, off));
      tB = fmaxf(tB, __shfl_xor_sync(0xffffffffu, tB, off));
    }
    const float nA = fmaxf(mA, tA), nB = fmaxf(mB, tB), fA = __expf(mA - nA), fB = __expf(mB - nB);
    mA = nA, mB = nB;
    float uA = 0.f, uB = 0.f;
#pragma unroll
    for (int nb = 0; nb < 4; ++nb)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        s[nb][c] = __expf(s[nb][c] - nA);
        s[nb][c + 2] = __expf(s[nb][c + 2] - nB);
        uA += s[nb][c];
        uB += s[nb][c + 2];
      }
    lA = lA * fA + uA;
    lB = lB * fB + uB;
    // P as A fragments (k-step ks = keys 16 ks .. 16 ks + 15 = n-blocks 2 ks, 2 ks + 1 of the scores).
    uint32_t ph[2][4], pl[2][4];
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      split2(s[2 * ks][0], s[2 * ks][1], ph[ks][0], pl[ks][0]);
      split2(s[2 * ks][2], s[2 * ks][3], ph[ks][1], pl[ks][1]);
      split2(s[2 * ks + 1][0], s[2 * ks + 1][1], ph[ks][2], pl[ks][2]);
      split2(s[2 * ks + 1][2], s[2 * ks + 1][3], ph[ks][3], pl[ks][3]);
    }
#pragma unroll
    for (int i = 0; i < kGroups; ++i) {
      const int g = quarter + kQuarters * i;
      if (g >= ngroups) break;
      float t[2][4] = {};  // this tile's P V of group g
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const uint32_t addr = planes_s + 2 * kPlane + v_lane + uint32_t((ks * 16 * kLdH + 16 * g) * 2);
        uint32_t vh[4];
        ldsm_x4_t(vh, addr);
        mma16816(t[0], ph[ks], vh[0], vh[1]);
        mma16816(t[1], ph[ks], vh[2], vh[3]);
        if (kSplit) {
          uint32_t vl[4];
          ldsm_x4_t(vl, addr + kPlane);
          mma16816(t[0], ph[ks], vl[0], vl[1]);
          mma16816(t[1], ph[ks], vl[2], vl[3]);
          mma16816(t[0], pl[ks], vh[0], vh[1]);
          mma16816(t[1], pl[ks], vh[2], vh[3]);
        }
      }
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
        o[i][nb][0] = fmaf(o[i][nb][0], fA, t[nb][0]), o[i][nb][1] = fmaf(o[i][nb][1], fA, t[nb][1]);
        o[i][nb][2] = fmaf(o[i][nb][2], fB, t[nb][2]), o[i][nb][3] = fmaf(o[i][nb][3], fB, t[nb][3]);
      }
    }
  }
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    lA += __shfl_xor_sync(0xffffffffu, lA, off);
    lB += __shfl_xor_sync(0xffffffffu, lB, off);
  }
  const float iA = 1.f / lA, iB = 1.f / lB;
#pragma unroll
  for (int i = 0; i < kGroups; ++i) {
    const int g = quarter + kQuarters * i;
    if (g >= ngroups) break;
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
      const int d = 16 * g + 8 * nb + c2;
      if (rowA)
        *reinterpret_cast<float2*>(a.out + ((m0 + r) * a.Hq + hA) * a.D + d) =
            make_float2(o[i][nb][0] * iA, o[i][nb][1] * iA);
      if (rowB)
        *reinterpret_cast<float2*>(a.out + ((m0 + r) * a.Hq + hB) * a.D + d) =
            make_float2(o[i][nb][2] * iB, o[i][nb][3] * iB);
    }
  }
}

template <bool PRE>
const void* mma_kernel(bool split, int pairs) {
  return pairs <= 3 ? (split ? reinterpret_cast<const void*>(&attn_prefill_mma_kernel<true, 3, PRE>)
                             : reinterpret_cast<const void*>(&attn_prefill_mma_kernel<false, 3, PRE>))
                    : (split ? reinterpret_cast<const void*>(&attn_prefill_mma_kernel<true, kPairs, PRE>)
                             : reinterpret_cast<const void*>(&attn_prefill_mma_kernel<false, kPairs, PRE>));
}

}  // namespace

void init_attn_prefill_mma_attributes() {
  for (bool split : {true, false})
    for (int pairs : {3, kPairs}) {
      cudaFuncSetAttribute(mma_kernel<false>(split, pairs), cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes));
      cudaFuncSetAttribute(mma_kernel<true>(split, pairs), cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(kPreSmemBytes));
    }
}

int64_t kv_planes_halves(int64_t T, int64_t Hkv, int64_t D) { return Hkv * 4 * T * D; }

Launch kv_planes_launch(const AttnDesc& d, void* planes, int64_t tp) {
  const int64_t T = d.p0 + d.M, n = T * d.Hkv * (d.D / 4);
  const PlanesArgs a{d.k, d.v, static_cast<__half*>(planes), T, d.Hkv, d.D, tp};
  return make_launch(reinterpret_cast<const void*>(&kv_planes_kernel), dim3(blocks_for(n, 256)), dim3(256), 0, a);
}

Launch attention_prefill_mma_launch(const AttnDesc& d, bool split, const void* planes, int64_t tp) {
  const MmaArgs a{d.q, d.k, d.v, d.out, d.M, d.p0, d.Hq, d.Hkv, d.D, d.scale, 0, static_cast<const __half*>(planes), tp};
  const int pairs = int(d.Hq / d.Hkv + 1) / 2;
  const dim3 grid(unsigned((d.M + kPos - 1) / kPos), unsigned(d.Hkv));
  if (planes)
    return make_launch(mma_kernel<true>(split, pairs), grid, dim3(pairs * kQuarters * 32), kPreSmemBytes, a);
  return make_launch(mma_kernel<false>(split, pairs), grid, dim3(pairs * kQuarters * 32), kSmemBytes, a);
}

}  // namespace bonsai::cuda
