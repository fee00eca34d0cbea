// The ternary path: the activation site kernel (pre-op, gather, sign + blockwise FWHT, int8 quantisation),
// the dp4a matvec for decode and the int8 tensor-core GEMM for prefill chunks.
//
// Activation format the ternary kernels read (written by site_kernel):
//   xq  int8 [M, K]     per 128-group symmetric quantisation q = rint(x / d), d = max|x| / 127; inside each
//                       16-element word the positions are TRANSPOSED: position 16i + 4j + b holds element
//                       16i + 4b + j. Why: a canonical weight word holds element 16i + 4b + j at bits
//                       8b + 2j, so `word & (3 << 2j) * 0x01010101` leaves the codes of elements
//                       {4b + j : b = 0..3} one per byte, and those meet x positions 4j..4j+3, i.e. one
//                       aligned int32 of xq: one LOP3 + one dp4a per 4 weights, no shifts, no repack of
//                       the weights (they stay canonical: device memory = pack bytes).
//   xds float2 [M, K/64] {d of the chunk's 128-group, sum of the chunk's 64 q} (the matvec uses unsigned
//                       codes 0..3 and subtracts the sum: sum((c - 1) q) = sum(c q) - sum(q)).
// q16 (levels = 2, the default; BONSAI_CUDA_ACT=q8 selects the one-digit form above): each element is TWO
// balanced int8 digits under the group's one scale s = amax / 127, base 254 as the CPU backend's
// (src/backend/cpu/kernels.h): v = x / s, q0 = rint(v), q1 = rint((v - q0) * 254), |q0|, |q1| <= 127,
// x ~= s (q0 + q1 / 254), error <= s / 508 (int8: s / 2). The kernels form Q = 254 q0 + q1 exactly in
// int32 (integer dots: 254 I0 + I1), so with the unit u = s / 254:
//   xq  int8 [M, 2, K]  digit plane l of row m at xq + (2 m + l) K, each plane in the transposed layout
//   xds float2 [M, K/64] {u = d / 254, S = 254 sum(q0) + sum(q1) over the chunk's 64 elements}
// (int8: u = d, S = sum(q0)); every kernel computes u * (sum(c Q) - S) per chunk / group.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include <cooperative_groups.h>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/ternary_dot.cuh"
#include "backend/cuda/warp_site.cuh"

namespace bonsai::cuda {

// ================================ site kernel =====================================================

namespace {

struct SiteArgs {
  const float* src;
  const float* src2;
  const float* gain;
  float* pre_out;
  float* resid;
  const int32_t* perm;
  const int8_t* signs;
  float* dst;
  int8_t* xq;
  float2* xds;
  int64_t ld, rows, K, n, tile;
  int32_t pre, inverse, seg, log2n;
  float eps, norm;
  int32_t levels;       // int8 digits per element in xq: 1 (q8) or 2 (q16)
  int32_t xpose;        // SiteDesc::xpose (tile 1024): 1 transposed FWHT stages, 2 also fewer barriers (site_tail)
  int32_t norm_threads; // site_kernel_cluster: the block size of norm_kernel for this K (its sum order), 0 otherwise
  int32_t cluster;      // SiteDesc::cluster (site_kernel_cluster): 2 = the residual stored after the exchange and
                        // the second arrive relaxed (no GPU-scope fence waiting on global stores), 1 = before
  int32_t stage;        // round 11: the warp sites' chunk loads / stores through shared memory (site_stage_on)
};

constexpr int kSiteThreads = 1024;  // one element per thread for a 1024 tile: short dependency chains at decode
constexpr int kSiteWarpThreads = 256;  // site_warp_kernel: 8 chunks (warps) per block
constexpr int kSiteRowUnitsMaxChunks = 20;  // its row-unit form: one block of K / 1024 warps per row

// site_kernel's quantiser for one 128-group held by one warp (lane l: elements 4l..4l+3 of group gq of the tile;
// xq / xds: the tile's first digit / scale). Header: the q8 / q16 format.
__device__ __forceinline__ void site_quantise_group(const SiteArgs& a, const float4 v4, int lane, int gq, int8_t* xq,
                                                    float2* xds) {
  const float amax = warp_max(fmaxf(fmaxf(fabsf(v4.x), fabsf(v4.y)), fmaxf(fabsf(v4.z), fabsf(v4.w))));
  const float d = amax / 127.f;
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  const float vs[4] = {v4.x * inv, v4.y * inv, v4.z * inv, v4.w * inv};
  // element e = 4l + t: word l/4, b = l%4, j = t -> position 16(l/4) + 4t + l%4
  int8_t* base = xq + gq * 128 + 16 * (lane >> 2) + (lane & 3);
  int s = 0;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const float q0f = rintf(vs[t]);  // round to nearest even, as the CPU quantiser
    const int q0 = max(-127, min(127, int(q0f)));
    base[4 * t] = int8_t(q0);
    if (a.levels == 2) {  // the residual |v - q0| <= 1/2 times 254 fits a digit with no clamp
      const int q1 = max(-127, min(127, __float2int_rn((vs[t] - q0f) * 254.f)));
      base[4 * t + a.K] = int8_t(q1);
      s += 254 * q0 + q1;
    } else {
      s += q0;
    }
  }
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);  // stays inside 16-lane halves
  if ((lane & 15) == 0) xds[gq * 2 + (lane >> 4)] = make_float2(a.levels == 2 ? d / 254.f : d, float(s));
}

// Whether site_tail takes the transposed FWHT (Options::site_xpose >= 1; tile 1024, 64 <= n <= 1024).
__device__ __forceinline__ bool site_xposed(const SiteArgs& a) {
  return a.xpose && a.tile == kSiteThreads && a.n >= 64 && a.n <= kSiteThreads;
}
// xpose 2: the caller hands each thread its own element (v0) with no barrier where it wrote that element
// itself (every pre-op but the gated norm, whose segments cross threads).
__device__ __forceinline__ bool site_own_element(const SiteArgs& a) {
  return a.xpose >= 2 && site_xposed(a) && a.pre != kPreGatedNorm;
}

// Stages 2-4 of the site (FWHT, normalise + inverse signs + fp32 store, int8 quantisation) for one tile of
// row r held in sh [len] (pre-op and forward signs applied; a barrier since they were written, unless
// site_own_element: then v0 = this thread's element, sh[tid], and no barrier). xs: the padded transpose buffer
// [kSiteThreads + kSiteThreads / 32] (used when site_xposed).
__device__ __forceinline__ void site_tail(const SiteArgs& a, float* sh, float* xs, int tid, int len, float sign0,
                                          int64_t r, int64_t t0, float v0) {
  // 2. Unnormalised Sylvester FWHT of every n-block of the tile (butterfly at stride h pairs i, i + h).
  // Strides below 32 stay inside a warp: thread tid holds element tid and swaps with lane ^ h through
  // shuffles (no barriers); a lane's partner is valid whenever the lane is (n-blocks lie inside len).
  // A tile longer than the block (the AddNorm site holds the whole row) takes its elements in passes of
  // kSiteThreads; every thread reads and writes back only its own elements, so no barrier between passes.
  // xpose (tile 1024, 64 <= n <= 1024): view the tile as [32 hi][32 lo] (element 32 hi + lo). Strides 1..16
  // act on lo (shuffles, thread = element), then ONE pass through xs hands warp w the column lo = w (lane =
  // hi), where strides 32..n/2 are shuffles too: 2 barriers instead of one per stride above 16. Same
  // butterflies (a + b low, a - b high) in the same stage order: bit-identical to the shared-memory stages.
  const bool xposed = site_xposed(a);
  if (xposed) {
    const int lane = tid & 31, w = tid >> 5;
    float v = site_own_element(a) ? v0 : tid < len ? sh[tid] : 0.f;
#pragma unroll
    for (int h = 1; h < 32; h <<= 1) {
      const float p = __shfl_xor_sync(0xffffffffu, v, h);
      v = (tid & h) ? p - v : v + p;
    }
    xs[tid + (tid >> 5)] = v;  // padded by one per 32: the column reads below hit 32 distinct banks
    __syncthreads();
    const int e = 32 * lane + w;  // this thread's element in the transposed view (hi = lane, lo = w)
    float u = e < len ? xs[e + lane] : 0.f;
    for (int m = 1; m < a.n / 32; m <<= 1) {  // stride 32 m: lane ^ m; n-blocks lie inside len
      const float p = __shfl_xor_sync(0xffffffffu, u, m);
      u = (lane & m) ? p - u : u + p;
    }
    if (e < len) xs[e + lane] = u;  // the slot this thread alone read: no barrier before the write
    __syncthreads();
    if (a.xpose >= 2 && a.xq && !a.inverse) {
      // xpose 2: normalise, store and quantise straight from xs, one warp per 128-group (lane l: elements
      // 4l..4l+3, inside one padded run of 32): the same values as stages 3-4, one barrier and pass fewer.
      float* dst = a.dst ? a.dst + r * a.K + t0 : nullptr;
      int8_t* xq = a.xq + r * a.levels * a.K + t0;
      float2* xds = a.xds + r * (a.K >> 6) + (t0 >> 6);
      for (int gq = w; gq < len / 128; gq += kSiteThreads / 32) {
        const int i0 = gq * 128 + 4 * lane;
        const float* x = xs + i0 + (i0 >> 5);
        const float4 v4 = make_float4(x[0] * a.norm, x[1] * a.norm, x[2] * a.norm, x[3] * a.norm);
        if (dst) dst[i0] = v4.x, dst[i0 + 1] = v4.y, dst[i0 + 2] = v4.z, dst[i0 + 3] = v4.w;
        site_quantise_group(a, v4, lane, gq, xq, xds);
      }
      return;
    }
  } else {
    int h0 = 1;
    if (a.n >= 2) {
      for (int c = 0; c < len; c += kSiteThreads) {  // uniform over the block: full-warp shuffles are safe
        const int i = c + tid;
        float v = i < len ? sh[i] : 0.f;
        for (int h = 1; h < a.n && h < 32; h <<= 1) {
          const float p = __shfl_xor_sync(0xffffffffu, v, h);
          v = (tid & h) ? p - v : v + p;
        }
        if (i < len) sh[i] = v;
      }
      while (h0 < a.n && h0 < 32) h0 <<= 1;
      __syncthreads();
    }
    for (int h = h0; h < a.n; h <<= 1) {
      for (int p = tid; p < len / 2; p += kSiteThreads) {
        const int i = ((p & ~(h - 1)) << 1) | (p & (h - 1));
        const float x0 = sh[i], x1 = sh[i + h];
        sh[i] = x0 + x1;
        sh[i + h] = x0 - x1;
      }
      __syncthreads();
    }
  }
  // 3. Normalise, inverse-side signs, store.
  float* dst = a.dst ? a.dst + r * a.K + t0 : nullptr;  // null: quantise only (x already holds the values)
  for (int i = tid; i < len; i += kSiteThreads) {
    float v = (xposed ? xs[i + (i >> 5)] : sh[i]) * a.norm;
    if (a.inverse && a.signs) v *= i == tid ? sign0 : float(a.signs[t0 + i]);
    sh[i] = v;
    if (dst) dst[i] = v;
  }
  if (!a.xq) return;
  __syncthreads();

  // 4. Quantisation per 128-group (one or two int8 digits, header): one warp per group, lane l holds
  // elements 4l..4l+3.
  const int warp = tid >> 5, lane = tid & 31;
  int8_t* xq = a.xq + r * a.levels * a.K + t0;  // digit plane 0 of row r; plane 1 follows at + K
  float2* xds = a.xds + r * (a.K >> 6) + (t0 >> 6);
  for (int gq = warp; gq < len / 128; gq += kSiteThreads / 32)
    site_quantise_group(a, *reinterpret_cast<const float4*>(&sh[gq * 128 + 4 * lane]), lane, gq, xq, xds);
}

__global__ __launch_bounds__(kSiteThreads) void site_kernel(const SiteArgs a) {
  extern __shared__ float sh[];  // [tile]
  __shared__ float xs[kSiteThreads + kSiteThreads / 32];  // [1024 + 32] the xpose transpose (site_tail)
  pdl_trigger();
  const int tid = threadIdx.x;
  const int64_t r = blockIdx.y;
  const int64_t t0 = int64_t(blockIdx.x) * a.tile;
  const int len = int(min(a.tile, a.K - t0));
  // The sign of this thread's first element is a model constant: read before waiting on the producer,
  // so its DRAM round trip (evicted since the last token) overlaps the wait instead of following it.
  const float sign0 = a.signs && tid < len ? float(a.signs[t0 + tid]) : 1.f;
  pdl_wait();
  const float* src = a.src + r * a.ld;
  const float* src2 = a.src2 ? a.src2 + r * a.ld : nullptr;

  // 1. value = pre(src, src2), gathered when perm is set.
  if (a.pre == kPreAddNorm) {  // the block holds the whole row (tile == K): v = src (+ resid); resid = v; rmsnorm(v) * gain
    __shared__ float red[32];
    float* resid = a.resid ? a.resid + r * a.ld : nullptr;
    float ss = 0.f;
    for (int i = tid; i < len; i += kSiteThreads) {
      const float v = resid ? src[i] + resid[i] : src[i];
      sh[i] = v;
      ss += v * v;
    }
    ss = block_sum(ss, red);
    const float rr = rsqrtf(ss / float(a.K) + a.eps);
    for (int i = tid; i < len; i += kSiteThreads) {  // each thread touches only its own elements
      if (resid) resid[i] = sh[i];
      sh[i] = sh[i] * rr * a.gain[i];
    }
  } else
  for (int i = tid; i < len; i += kSiteThreads) {
    const int64_t gi = t0 + i;
    const int64_t si = a.perm ? int64_t(a.perm[gi]) : gi;
    float v = src[si];
    if (a.pre == kPreSiluMul) v = siluf_(v) * src2[si];
    else if (a.pre == kPreSigmoidMul) v = v * sigmoidf_(src2[si]);
    sh[i] = v;
  }
  if (a.pre == kPreGatedNorm) {  // rmsnorm per segment of `seg` (tile % seg == 0) * gain * silu(z)
    __syncthreads();
    const int warp = tid >> 5, lane = tid & 31, nseg = len / a.seg;
    for (int s = warp; s < nseg; s += kSiteThreads / 32) {
      float ss = 0.f;
      for (int i = lane; i < a.seg; i += 32) ss += sh[s * a.seg + i] * sh[s * a.seg + i];
      ss = warp_sum(ss);
      const float rr = rsqrtf(ss / float(a.seg) + a.eps);
      for (int i = lane; i < a.seg; i += 32) {
        const int j = s * a.seg + i;
        sh[j] = sh[j] * rr * a.gain[i] * siluf_(src2[t0 + j]);
      }
    }
  }
  const bool own = site_own_element(a);  // every element below is read by the thread that wrote it
  if (a.pre != kPreNone && a.pre_out) {
    if (!own) __syncthreads();
    for (int i = tid; i < len; i += kSiteThreads) a.pre_out[r * a.ld + t0 + i] = sh[i];
  }
  if (!a.inverse && a.signs)
    for (int i = tid; i < len; i += kSiteThreads) sh[i] *= i == tid ? sign0 : float(a.signs[t0 + i]);
  if (!own) __syncthreads();
  site_tail(a, sh, xs, tid, len, sign0, r, t0, own && tid < len ? sh[tid] : 0.f);
}

// rmsnorm / add_rmsnorm fused into the site for small row counts (SiteDesc::cluster; round 9): the row's C
// tiles of 1024 are C blocks of ONE thread-block cluster (grid (C, rows), cluster (C, 1, 1)); block b reads and
// writes only its own tile of src / resid / pre_out and keeps every other stage of site_kernel (site_tail), so
// the row is not serialised on one SM (the single-block kPreAddNorm path, docs round "Site v2", was -5 %).
// The row's sum of squares crosses the blocks through distributed shared memory, in norm_kernel's order:
// norm_kernel's thread t (of T = norm_threads) sums sq4(float4 i) for i = t, t + T, ... and block_sum adds
// the threads; float4 i lies in tile i / 256, so every block rebuilds all T thread partials from the C blocks'
// q4 arrays and runs the same block_sum: the same rr in every block, bit-identical to norm_kernel's.
template <int C>
__global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(kSiteThreads) site_kernel_cluster(const SiteArgs a) {
  __shared__ __align__(16) float sh[kSiteThreads];        // [1024] this block's tile
  __shared__ float xs[kSiteThreads + kSiteThreads / 32];  // [1024 + 32] the xpose transpose (site_tail)
  __shared__ float q4[kSiteThreads / 4];                  // [256] sq4 of the tile's float4s, read by the whole cluster
  __shared__ float red[32];
  pdl_trigger();
  const int tid = threadIdx.x;
  const int64_t r = blockIdx.y;
  const int64_t t0 = int64_t(blockIdx.x) * kSiteThreads;  // blockIdx.x == the block's rank in the cluster (grid.x == C)
  // Model constants before the wait (their DRAM round trips overlap it).
  const float g = a.gain[t0 + tid];
  const float sign0 = a.signs ? float(a.signs[t0 + tid]) : 1.f;
  pdl_wait();
  // On sm_90 the release of a cluster arrive is a GPU-scope fence (MEMBAR.ALL.GPU in the SASS): it waits for
  // this thread's outstanding global stores. cluster >= 2 stores the residual after the exchange instead.
  float4* h = a.resid ? reinterpret_cast<float4*>(a.resid + r * a.ld + t0) : nullptr;
  float4 v4 = make_float4(0.f, 0.f, 0.f, 0.f);
  if (tid < kSiteThreads / 4) {  // norm_kernel's float4 pass: v = src (+ resid), resid = v
    v4 = reinterpret_cast<const float4*>(a.src + r * a.ld + t0)[tid];
    if (h) {
      const float4 hv = h[tid];
      v4 = make_float4(hv.x + v4.x, hv.y + v4.y, hv.z + v4.z, hv.w + v4.w);
      if (a.cluster < 2) h[tid] = v4;
    }
    reinterpret_cast<float4*>(sh)[tid] = v4;
    q4[tid] = sq4(v4);
  }
  cluster_arrive();
  cluster_wait();  // every tile's q4 (and this block's sh) visible
  if (h && a.cluster >= 2 && tid < kSiteThreads / 4) h[tid] = v4;
  float ss = 0.f;
  if (tid < a.norm_threads) {
    cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    for (int64_t i = tid; i < a.K / 4; i += a.norm_threads)
      ss += cl.map_shared_rank(q4, unsigned(i >> 8))[i & 255];  // float4 i: tile i / 256, slot i % 256
  }
  ss = block_sum(ss, red);
  // done reading the other blocks' q4 (the values are summed: the loads returned); waited for before exit
  if (a.cluster >= 2) cluster_arrive_relaxed();
  else cluster_arrive();
  const float rr = rsqrtf(ss / float(a.K) + a.eps);
  float v = sh[tid] * rr * g;
  if (a.pre_out) a.pre_out[r * a.ld + t0 + tid] = v;
  if (!a.inverse && a.signs) v *= sign0;
  sh[tid] = v;
  if (!site_own_element(a)) __syncthreads();
  site_tail(a, sh, xs, tid, kSiteThreads, sign0, r, t0, v);
  cluster_wait();
}

// Round 11: the warp site's global traffic through a per-warp shared-memory tile (buf: [32][33] floats, row l =
// lane l's 32 elements, padded so both the row reads and the column writes hit 32 banks). Lane l owns elements
// 32 l .. 32 l + 31 of the 1024 chunk, so its own 16-byte accesses are 128 bytes apart across the warp: each
// load / store instruction touched 32 lines (half sectors). Through the tile every instruction moves 512
// contiguous bytes. Values are only moved: the results stay bit-identical. chunk: the chunk's first element.
__device__ __forceinline__ void warp_rows_load(const float* chunk, float* buf, int lane, float (&v)[32]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float4 f = reinterpret_cast<const float4*>(chunk)[32 * k + lane];  // elements 128 k + 4 lane ..
    float* p = buf + (4 * k + (lane >> 3)) * 33 + 4 * (lane & 7);
    p[0] = f.x, p[1] = f.y, p[2] = f.z, p[3] = f.w;
  }
  __syncwarp();
#pragma unroll
  for (int j = 0; j < 32; ++j) v[j] = buf[lane * 33 + j];
  __syncwarp();  // buf free again
}
__device__ __forceinline__ void warp_rows_store(float* chunk, float* buf, int lane, const float (&v)[32]) {
#pragma unroll
  for (int j = 0; j < 32; ++j) buf[lane * 33 + j] = v[j];
  __syncwarp();
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float* p = buf + (4 * k + (lane >> 3)) * 33 + 4 * (lane & 7);
    reinterpret_cast<float4*>(chunk)[32 * k + lane] = make_float4(p[0], p[1], p[2], p[3]);
  }
  __syncwarp();
}
// One digit plane of the chunk (1024 bytes; lane l's 8 words at bytes 32 l ..), words padded 9 per lane.
__device__ __forceinline__ void warp_words_store(int8_t* plane, uint32_t* buf, int lane, const uint32_t (&w)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) buf[lane * 9 + i] = w[i];
  __syncwarp();
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const uint32_t* p = buf + (16 * m + (lane >> 1)) * 9 + 4 * (lane & 1);  // words 128 m + 4 lane ..
    reinterpret_cast<uint4*>(plane)[32 * m + lane] = make_uint4(p[0], p[1], p[2], p[3]);
  }
  __syncwarp();
}

// Stages after the pre-op of the warp site, for the chunk of row r whose lane-l elements start at e0 (v: the
// pre-op's values, lane l elements e0 .. e0 + 31): signs, FWHT, * norm, fp32 store (site_warp_transform, which
// returns the lane's max |v|), then the int8 quantiser (site_warp_quantise). Shared by site_warp_kernel,
// site_warp_rows_kernel and site_norm_warp_kernel (the same operations in the same order).
// buf: the warp's [32][33] staging tile (warp_rows_*), or null: direct 16-byte stores.
__device__ __forceinline__ float site_warp_transform(const SiteArgs& a, float (&v)[32], int64_t r, int64_t e0, int lane,
                                                     float* buf) {
  uint32_t sg[8];  // the signs' bytes (element 4 k + b at byte b of word k): applied before the transform (forward) or
                   // after it (inverse)
#pragma unroll
  for (int k = 0; k < 8; ++k) sg[k] = a.signs ? *reinterpret_cast<const uint32_t*>(a.signs + e0 + 4 * k) : 0x01010101u;
  if (!a.inverse && a.signs) {
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = sign_flip(v[j], sg[j >> 2], j & 3);
  }
  const int n = int(a.n);
#pragma unroll
  for (int h = 1; h < 32; h <<= 1) {
    if (h < n) {
#pragma unroll
      for (int j = 0; j < 32; ++j)
        if ((j & h) == 0) {
          const float x0 = v[j], x1 = v[j + h];
          v[j] = x0 + x1;
          v[j + h] = x0 - x1;
        }
    }
  }
#pragma unroll
  for (int h = 32; h < 1024; h <<= 1) {
    if (h < n) {
      const int m = h / 32;
      const bool upper = lane & m;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const float p = __shfl_xor_sync(0xffffffffu, v[j], m);
        v[j] = butterfly(v[j], p, upper);
      }
    }
  }
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    v[j] *= a.norm;
    if (a.inverse && a.signs) v[j] = sign_flip(v[j], sg[j >> 2], j & 3);
    amax = fmaxf(amax, fabsf(v[j]));
  }
  if (a.dst && buf) {
    warp_rows_store(a.dst + r * a.K + e0 - 32 * lane, buf, lane, v);
  } else if (a.dst) {
    float4* d = reinterpret_cast<float4*>(a.dst + r * a.K + e0);
#pragma unroll
    for (int k = 0; k < 8; ++k) d[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
  }
  return amax;
}
// site_kernel's quantiser with the unit of amax (the chunk's 128-group, or the row's under SiteArgs::row_units):
// inv = 127 / amax, q0 = rint(v inv), q1 = the residual * 254 (q16); positions transposed within each 16: element
// 16w + 4b + t -> byte 16w + 4t + b; xds per 64-chunk as ever (under row units every chunk of the row has its unit).
__device__ __forceinline__ void site_warp_quantise(const SiteArgs& a, const float (&v)[32], int64_t r, int64_t e0,
                                                   int lane, float* buf, float amax) {
  const float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
  int q0[32], q1[32];
  int sum = 0;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const float vs = v[j] * inv;  // |vs| <= 127 (inv = 0 for a zero chunk)
    int qi;
    const float q0f = rint_bits(vs, qi);
    q0[j] = max(-127, min(127, qi));
    if (a.levels == 2) {
      int ri;
      rint_bits((vs - q0f) * 254.f, ri);
      q1[j] = max(-127, min(127, ri));
      sum += 254 * q0[j] + q1[j];
    } else {
      q1[j] = 0;
      sum += q0[j];
    }
  }
  // word 4 w + t holds elements 16 w + 4 b + t at byte b
  uint32_t p0[8], p1[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int w = k >> 2, t = k & 3, j = 16 * w + t;
    p0[k] = pack4(q0[j], q0[j + 4], q0[j + 8], q0[j + 12]);
    p1[k] = pack4(q1[j], q1[j + 4], q1[j + 8], q1[j + 12]);
  }
  int8_t* xq = a.xq + r * a.levels * a.K + e0;  // digit plane 0 of row r; plane 1 at + K
  if (buf) {
    uint32_t* wb = reinterpret_cast<uint32_t*>(buf);
    warp_words_store(xq - 32 * lane, wb, lane, p0);
    if (a.levels == 2) warp_words_store(xq - 32 * lane + a.K, wb, lane, p1);
  } else {
    reinterpret_cast<uint4*>(xq)[0] = make_uint4(p0[0], p0[1], p0[2], p0[3]);
    reinterpret_cast<uint4*>(xq)[1] = make_uint4(p0[4], p0[5], p0[6], p0[7]);
    if (a.levels == 2) {
      reinterpret_cast<uint4*>(xq + a.K)[0] = make_uint4(p1[0], p1[1], p1[2], p1[3]);
      reinterpret_cast<uint4*>(xq + a.K)[1] = make_uint4(p1[4], p1[5], p1[6], p1[7]);
    }
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);  // a 64-chunk is two lanes
  if ((lane & 1) == 0) a.xds[r * (a.K >> 6) + (e0 >> 6)] = make_float2(a.levels == 2 ? d / 254.f : d, float(sum));
}
// Both, with the unit of each 128-group (4 lanes).
__device__ __forceinline__ void site_warp_tail(const SiteArgs& a, float (&v)[32], int64_t r, int64_t e0, int lane,
                                               float* buf = nullptr) {
  float amax = site_warp_transform(a, v, r, e0, lane, buf);
  if (!a.xq) return;
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  site_warp_quantise(a, v, r, e0, lane, buf, amax);
}

// The site for prefill rows (SiteDesc::warp, rows >= kSiteWarpMinRows): one WARP per 1024-element chunk of a
// row, the chunk in registers (lane l holds elements 32 l .. 32 l + 31), no block barriers.
// site_kernel runs one 1024-thread block per chunk with a barrier per FWHT stage above 16: at 256 rows it
// took 53.6 us per call (5 waves of 2 blocks per SM, each a chain of barriers), 20 % of a prefill chunk.
// The same operations in the same order as site_kernel (pre-op, signs, butterflies a + b / a - b at
// h = 1, 2, 4, ..., * norm, the same quantiser), so xq / xds / dst are bit-identical to it for every
// pre-op but the gated norm, whose sum of squares is summed in another order.
// STAGE (round 11, the default; BONSAI_CUDA_SITE_STAGE=0: off): the loads and stores of whole chunks through the
// warp's shared-memory tile (warp_rows_load / warp_rows_store / warp_words_store), coalesced; the gather (perm)
// reads stay direct. Bit-identical to STAGE = false. H200, one call: pp2048 4,499 / 4,474 vs 4,337 / 4,354 tok/s
// without it; the site 25.0 -> 18.0 us per launch on average (docs/cuda-kernels.md round 11).
// ROWU (round 19, site_row_units): one block per row, warp w its chunk w (K / 1024 <= 20 warps: 640 threads keep the
// plain instance's ~94 registers; at a 1024-thread bound ptxas spilled 400 B), the staging
// tiles in dynamic shared memory ([K / 1024][32 * 33] floats), and every 128-group quantised with the ROW's unit (the
// row's max |v| after the transform, met in shared memory after one barrier): GEMM v3 then scales a group by d_w
// alone and each output by its token's unit once (gemm_ws.cu).
template <bool STAGE, bool ROWU = false>
__global__ __launch_bounds__(ROWU ? 32 * kSiteRowUnitsMaxChunks : kSiteWarpThreads) void site_warp_kernel(const SiteArgs a) {
  __shared__ float tiles[STAGE && !ROWU ? kSiteWarpThreads / 32 : 1][32 * 33];
  extern __shared__ float row_tiles[];  // ROWU && STAGE: [K / 1024][32 * 33]
  __shared__ float wmax[ROWU ? 32 : 1];
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int64_t chunks = a.K >> 10;
  const int64_t unit = ROWU ? int64_t(blockIdx.x) * chunks + (threadIdx.x >> 5)
                            : int64_t(blockIdx.x) * (kSiteWarpThreads / 32) + (threadIdx.x >> 5);
  if (!ROWU && unit >= a.rows * chunks) return;  // warp-uniform: whole warps only (ROWU: the grid is exact)
  const int64_t r = unit / chunks, c0 = (unit % chunks) << 10, e0 = c0 + 32 * lane;  // e0: lane's first element
  const float* src = a.src + r * a.ld;
  float* buf = !STAGE ? nullptr : ROWU ? row_tiles + (threadIdx.x >> 5) * (32 * 33) : tiles[threadIdx.x >> 5];
  float v[32];
  if (a.perm) {
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = src[a.perm[e0 + j]];
  } else if (STAGE) {
    warp_rows_load(src + c0, buf, lane, v);
  } else {
    lane_load32(src + e0, v);
  }
  if (a.pre == kPreSiluMul || a.pre == kPreSigmoidMul || a.pre == kPreGatedNorm) {  // no perm with a pre-op
    const float* src2 = a.src2 + r * a.ld;
    float u[32];
    if (STAGE) warp_rows_load(src2 + c0, buf, lane, u);
    else lane_load32(src2 + e0, u);
    lane_pre_op32(a.pre, v, u, a.seg, a.eps, a.gain, e0);
    if (a.pre_out && STAGE) {
      warp_rows_store(a.pre_out + r * a.ld + c0, buf, lane, v);
    } else if (a.pre_out) {
      float4* po = reinterpret_cast<float4*>(a.pre_out + r * a.ld + e0);
#pragma unroll
      for (int k = 0; k < 8; ++k) po[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
    }
  }
  if constexpr (ROWU) {
    float amax = warp_max(site_warp_transform(a, v, r, e0, lane, buf));
    if (lane == 0) wmax[threadIdx.x >> 5] = amax;
    __syncthreads();
    for (int w = 0; w < int(chunks); ++w) amax = fmaxf(amax, wmax[w]);
    site_warp_quantise(a, v, r, e0, lane, buf, amax);
  } else {
    site_warp_tail(a, v, r, e0, lane, buf);
  }
}

// Round 28 (SiteDesc::rows_pipe, Options::site_rows_pipe): the row-unit site with the next row's loads in flight. At
// pp2048 site_warp_kernel<true, true> ran its three shapes at ~1.5-1.7 TB/s (K 5,120: 42 us, 6,144 with a second source:
// 80 us, silu * up over 17,408: 213 us a launch; the norm kernel beside it streams 3.6 TB/s): one block per row, each
// warp's chunk loaded, then transformed, quantised and stored with nothing in flight. Here a block takes rows
// blockIdx.x, + gridDim.x, ... (as many blocks as fit), and each warp copies its chunk of the NEXT row into its shared
// load tile (cp.async) as soon as this row's values are in registers, so the copy overlaps this row's transform,
// quantiser and stores. The same values through the same operations (site_warp_transform / site_warp_quantise, the row
// max in warp order): bit-identical to site_warp_kernel<true, true>. NSRC: 1 (src) or 2 (src2 of the pre-op too).
// Shared memory: [chunks][NSRC][1024] floats of load tiles (lane row i's 16-byte piece c at 32 i + 4 (c ^ (i & 7)):
// 16-byte aligned for cp.async, conflict-free both ways) then [chunks][32 * 33] store tiles (warp_rows_store's).
constexpr int64_t kSiteRowsPipeMaxSmem = 227 * 1024 - 1024;  // an sm_90 block's 227 KB less its static wmax (1 KB kept)
constexpr int64_t kSiteRowsPipeTileBytes = 1024 * 4;  // one source's load tile per warp
constexpr int64_t kSiteRowsPipeStoreBytes = 32 * 33 * 4;
int64_t site_rows_pipe_smem(int64_t chunks, int nsrc) {
  return chunks * (nsrc * kSiteRowsPipeTileBytes + kSiteRowsPipeStoreBytes);
}
template <int NSRC>
__global__ __launch_bounds__(32 * kSiteRowUnitsMaxChunks) void site_warp_rows_kernel(const SiteArgs a) {
  extern __shared__ __align__(16) float pipe_smem[];
  __shared__ float wmax[2][32];  // [row parity][warp] the chunks' max |v|
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int chunks = int(a.K >> 10);
  float* ld_tile = pipe_smem + w * NSRC * 1024;                                       // [NSRC][1024]
  float* st_tile = pipe_smem + int64_t(chunks) * NSRC * 1024 + w * (32 * 33);        // [32][33]
  const int64_t c0 = int64_t(w) << 10, e0 = c0 + 32 * lane;
  // Row r's chunk of each source into the load tile: copy k of a lane is elements 128 k + 4 lane .. (row i = 4 k +
  // lane / 8 of the tile, piece lane % 8), one commit group.
  auto issue = [&](int64_t r) {
#pragma unroll
    for (int sidx = 0; sidx < NSRC; ++sidx) {
      const float* src = (sidx ? a.src2 : a.src) + r * a.ld + c0;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int i = 4 * k + (lane >> 3), c = lane & 7;
        cp_async16(ld_tile + sidx * 1024 + i * 32 + 4 * (c ^ (i & 7)), src + 128 * k + 4 * lane, 16);
      }
    }
    cp_async_commit();
  };
  auto take = [&](int sidx, float (&v)[32]) {  // the lane's 32 elements (tile row `lane`)
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const float4 f = *reinterpret_cast<const float4*>(ld_tile + sidx * 1024 + lane * 32 + 4 * (c ^ (lane & 7)));
      v[4 * c] = f.x, v[4 * c + 1] = f.y, v[4 * c + 2] = f.z, v[4 * c + 3] = f.w;
    }
  };
  int par = 0;
  int64_t r = blockIdx.x;
  if (r < a.rows) issue(r);
  for (; r < a.rows; r += gridDim.x, par ^= 1) {
    cp_async_wait<0>();
    __syncwarp();  // every lane's copies of row r landed
    float v[32], u[32];
    take(0, v);
    if constexpr (NSRC == 2) take(1, u);
    __syncwarp();  // the tile is read: the next row's copies may land in it
    if (r + gridDim.x < a.rows) issue(r + gridDim.x);
    if constexpr (NSRC == 2) {
      lane_pre_op32(a.pre, v, u, a.seg, a.eps, a.gain, e0);
      if (a.pre_out) warp_rows_store(a.pre_out + r * a.ld + c0, st_tile, lane, v);
    }
    float amax = warp_max(site_warp_transform(a, v, r, e0, lane, st_tile));
    if (lane == 0) wmax[par][w] = amax;
    __syncthreads();  // (wmax[par] is rewritten two rows on, after the next row's barrier)
    for (int ww = 0; ww < chunks; ++ww) amax = fmaxf(amax, wmax[par][ww]);
    site_warp_quantise(a, v, r, e0, lane, st_tile, amax);
  }
}

// Round 11: the add_rmsnorm / rmsnorm fused into the warp site of prefill rows (SiteDesc::warp, kPreAddNorm, rows
// >= kSiteWarpMinRows; Options::site_norm_warp). One block per row of norm_kernel's size (norm_block_threads(K)):
// phase 1 is norm_kernel's float4 pass (v = src (+ resid), resid = v, the sum of squares in its order, the same
// block_sum), phase 2 its output v * rr * g (written to pre_out, the normed x, and kept in shared memory), then warp
// w < K / 1024 runs site_warp_kernel's stages on chunk w from shared memory. Bit-identical to norm_kernel followed by
// site_warp_kernel (the unfused prefill path), one launch and one 4 K-byte pass over the row fewer. Shared memory:
// the row padded by one float per 32 (element e at e + e / 32), so lane l's reads of its 32 elements hit 32 banks.
// Off by default: slower on the H200 (26.2 us per launch against 8.9 + ~16 for the pair, pp2048 4,350 vs 4,398
// tok/s; 1024-thread blocks at 64 registers spill 124 B, and 5 of the 32 warps run the site stages of a row).
__global__ __launch_bounds__(1024) void site_norm_warp_kernel(const SiteArgs a) {
  extern __shared__ float sv[];  // [K + K / 32]
  __shared__ float red[32];
  pdl_trigger();
  const int tid = threadIdx.x;
  const int64_t n4 = a.K >> 2;
  const float4* gain4 = reinterpret_cast<const float4*>(a.gain);
  const float4 g0 = tid < n4 ? gain4[tid] : make_float4(1.f, 1.f, 1.f, 1.f);  // a model constant: before the wait
  pdl_wait();
  const int64_t r = blockIdx.x;
  const float4* x4 = reinterpret_cast<const float4*>(a.src + r * a.ld);
  float4* h4 = a.resid ? reinterpret_cast<float4*>(a.resid + r * a.ld) : nullptr;
  float ss = 0.f;
  for (int64_t i = tid; i < n4; i += blockDim.x) {
    float4 v = x4[i];
    if (h4) {
      const float4 hv = h4[i];
      v = make_float4(hv.x + v.x, hv.y + v.y, hv.z + v.z, hv.w + v.w);
      h4[i] = v;
    }
    ss += sq4(v);
    float* p = sv + 4 * i + (i >> 3);  // elements 4i .. 4i + 3 lie in one padded run of 32
    p[0] = v.x, p[1] = v.y, p[2] = v.z, p[3] = v.w;
  }
  ss = block_sum(ss, red);  // its barriers also order the shared-memory writes above before the reads below
  const float rr = rsqrtf(ss / float(a.K) + a.eps);
  float4* po = a.pre_out ? reinterpret_cast<float4*>(a.pre_out + r * a.ld) : nullptr;
  for (int64_t i = tid; i < n4; i += blockDim.x) {  // each thread re-reads only the slots it wrote
    float* p = sv + 4 * i + (i >> 3);
    const float4 g = i == tid ? g0 : gain4[i];
    const float4 o = make_float4(p[0] * rr * g.x, p[1] * rr * g.y, p[2] * rr * g.z, p[3] * rr * g.w);
    if (po) po[i] = o;
    p[0] = o.x, p[1] = o.y, p[2] = o.z, p[3] = o.w;
  }
  __syncthreads();
  const int lane = tid & 31;
  for (int64_t c = tid >> 5; c < (a.K >> 10); c += blockDim.x >> 5) {
    const int64_t e0 = (c << 10) + 32 * lane;
    const float* p = sv + e0 + (e0 >> 5);
    float v[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = p[j];
    __syncwarp();
    // the chunk's own padded region (1056 floats = a [32][33] tile) stages its stores (only this warp reads it)
    site_warp_tail(a, v, r, e0, lane, a.stage ? sv + (c << 10) + (c << 5) : nullptr);
  }
}

int ilog2(int64_t n) {
  int l = 0;
  while ((int64_t(1) << l) < n) ++l;
  return l;
}

}  // namespace

bool site_cluster_shape_ok(int64_t K, int64_t n) {
  return K % kSiteThreads == 0 && K / kSiteThreads <= kSiteMaxCluster && n <= kSiteThreads;
}

bool site_cluster_supported(const SiteDesc& d) {
  // float4 access to src / resid rows; the gain's element per thread
  return d.cluster > 0 && d.pre == kPreAddNorm && !d.perm && d.gain && site_cluster_shape_ok(d.K, d.n) && d.ld % 4 == 0 &&
         reinterpret_cast<uintptr_t>(d.src) % 16 == 0 && reinterpret_cast<uintptr_t>(d.resid) % 16 == 0 &&
         d.rows <= 65535;
}

bool site_warp_supported(const SiteDesc& d) {
  if (!d.warp || d.rows < kSiteWarpMinRows || d.K % 1024 != 0 || d.n > 1024 || d.pre == kPreAddNorm) return false;
  if (d.perm && d.pre != kPreNone) return false;
  if (d.pre == kPreGatedNorm && (d.seg < 32 || d.seg > 1024 || (d.seg & (d.seg - 1)) != 0)) return false;
  // 16-byte loads and stores of each lane's 32 elements
  return d.ld % 4 == 0 && reinterpret_cast<uintptr_t>(d.src) % 16 == 0 &&
         (!d.src2 || reinterpret_cast<uintptr_t>(d.src2) % 16 == 0) && (!d.dst || reinterpret_cast<uintptr_t>(d.dst) % 16 == 0) &&
         (!d.pre_out || reinterpret_cast<uintptr_t>(d.pre_out) % 16 == 0) && (!d.xq || reinterpret_cast<uintptr_t>(d.xq) % 16 == 0) &&
         (!d.signs || reinterpret_cast<uintptr_t>(d.signs) % 4 == 0);
}

// (site_warp_supported already excludes AddNorm, which the fused-norm and cluster forms that site_launch tries first
// require.)
bool site_row_units(const SiteDesc& d) {
  return d.row_units && d.xq && site_warp_supported(d) && d.K / 1024 <= kSiteRowUnitsMaxChunks && d.rows <= 0x7fffffff;
}

// site_warp_rows_kernel's sources for d: src, and src2 under a pre-op (the warp site's pre-ops all read one).
static int site_rows_pipe_sources(const SiteDesc& d) { return d.pre == kPreNone ? 1 : 2; }
// site_warp_rows_kernel (round 28): the row-unit site of d, no gather, its tiles within one block's shared memory.
bool site_rows_pipe_supported(const SiteDesc& d) {
  return d.rows_pipe && site_row_units(d) && !d.perm &&
         site_rows_pipe_smem(d.K >> 10, site_rows_pipe_sources(d)) <= kSiteRowsPipeMaxSmem;
}
// The blocks of one site_warp_rows_kernel launch: as many as are resident at once on the current device (each then
// walks its rows), computed once per (instance, chunk count).
static int64_t site_rows_pipe_blocks(const void* f, int64_t chunks, int64_t smem) {
  static std::atomic<int> cache[2][kSiteRowUnitsMaxChunks + 1] = {};
  const int which = f == reinterpret_cast<const void*>(&site_warp_rows_kernel<2>) ? 1 : 0;
  int n = cache[which][chunks].load(std::memory_order_relaxed);
  if (n == 0) {
    int dev = 0, sms = 0, per_sm = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f, int(32 * chunks), size_t(smem));
    n = std::max(1, sms * std::max(1, per_sm));
    cache[which][chunks].store(n, std::memory_order_relaxed);
  }
  return n;
}

// Round 11 A/B switch, read per warp-site launch (prefill only): BONSAI_CUDA_SITE_STAGE=0 turns the staging off.
static bool site_stage_on() {
  const char* e = std::getenv("BONSAI_CUDA_SITE_STAGE");
  return !(e && e[0] == '0' && e[1] == 0);
}

bool site_norm_warp_supported(const SiteDesc& d) {
  if (!d.warp || d.pre != kPreAddNorm || d.rows < kSiteWarpMinRows || d.inverse || d.perm || !d.gain) return false;
  if (d.K % 1024 != 0 || d.K > kSiteNormWarpMaxK || d.n > 1024 || d.ld % 4 != 0 || d.rows > 0x7fffffff) return false;
  // float4 access to src / resid / pre_out / gain, site_warp_tail's 16-byte stores of dst and xq
  return aligned16(d.src) && aligned16(d.resid) && aligned16(d.pre_out) && aligned16(d.gain) && aligned16(d.dst) &&
         aligned16(d.xq) &&
         (!d.signs || reinterpret_cast<uintptr_t>(d.signs) % 4 == 0);
}

Launch site_launch(const SiteDesc& d) {
  SiteArgs a{};
  a.src = d.src;
  a.src2 = d.src2;
  a.gain = d.gain;
  a.pre_out = d.pre_out;
  a.resid = d.resid;
  a.perm = d.perm;
  a.signs = d.signs;
  a.dst = d.dst;
  a.xq = d.xq;
  a.xds = d.xds;
  a.ld = d.ld;
  a.rows = d.rows;
  a.K = d.K;
  a.n = d.n;
  a.tile = d.pre == kPreAddNorm ? d.K : d.n >= 1024 ? d.n : 1024;
  a.pre = d.pre;
  a.inverse = d.inverse;
  a.seg = d.seg;
  a.log2n = ilog2(d.n);
  a.eps = d.eps;
  a.norm = float(1.0 / __builtin_sqrt(double(d.n)));
  a.levels = d.levels == 2 ? 2 : 1;
  a.xpose = d.xpose;
  if (site_norm_warp_supported(d)) {  // before the cluster form, which would take these rows too
    a.tile = kSiteThreads;
    a.stage = site_stage_on();
    return make_launch(reinterpret_cast<const void*>(&site_norm_warp_kernel), dim3(unsigned(d.rows)),
                       dim3(unsigned(norm_block_threads(d.K))), uint32_t((d.K + d.K / 32) * sizeof(float)), a);
  }
  if (site_cluster_supported(d)) {
    // one template instance per cluster width (__cluster_dims__ is a compile-time attribute)
    static const void* const kernels[kSiteMaxCluster] = {
        reinterpret_cast<const void*>(&site_kernel_cluster<1>), reinterpret_cast<const void*>(&site_kernel_cluster<2>),
        reinterpret_cast<const void*>(&site_kernel_cluster<3>), reinterpret_cast<const void*>(&site_kernel_cluster<4>),
        reinterpret_cast<const void*>(&site_kernel_cluster<5>), reinterpret_cast<const void*>(&site_kernel_cluster<6>),
        reinterpret_cast<const void*>(&site_kernel_cluster<7>), reinterpret_cast<const void*>(&site_kernel_cluster<8>)};
    const int64_t C = d.K / kSiteThreads;
    a.tile = kSiteThreads;
    a.norm_threads = int32_t(norm_block_threads(d.K));
    a.cluster = d.cluster;
    return make_launch(kernels[C - 1], dim3(unsigned(C), unsigned(d.rows)), dim3(kSiteThreads), 0, a);
  }
  if (site_row_units(d)) {
    a.stage = site_stage_on();
    if (site_rows_pipe_supported(d) && a.stage) {
      const int nsrc = site_rows_pipe_sources(d);
      const void* f = nsrc == 2 ? reinterpret_cast<const void*>(&site_warp_rows_kernel<2>)
                                : reinterpret_cast<const void*>(&site_warp_rows_kernel<1>);
      const int64_t chunks = d.K >> 10, smem = site_rows_pipe_smem(chunks, nsrc);
      return make_launch(f, dim3(unsigned(std::min<int64_t>(d.rows, site_rows_pipe_blocks(f, chunks, smem)))),
                         dim3(unsigned(32 * chunks)), uint32_t(smem), a);
    }
    const void* f = a.stage ? reinterpret_cast<const void*>(&site_warp_kernel<true, true>)
                            : reinterpret_cast<const void*>(&site_warp_kernel<false, true>);
    const uint32_t smem = a.stage ? uint32_t((d.K >> 10) * 32 * 33 * sizeof(float)) : 0;
    return make_launch(f, dim3(unsigned(d.rows)), dim3(unsigned(32 * (d.K >> 10))), smem, a);
  }
  if (site_warp_supported(d)) {
    const int64_t warps = d.rows * (d.K >> 10), per_block = kSiteWarpThreads / 32;
    a.stage = site_stage_on();
    const void* f = a.stage ? reinterpret_cast<const void*>(&site_warp_kernel<true>)
                            : reinterpret_cast<const void*>(&site_warp_kernel<false>);
    return make_launch(f, dim3(unsigned((warps + per_block - 1) / per_block)),
                       dim3(kSiteWarpThreads), 0, a);
  }
  const dim3 grid(unsigned((d.K + a.tile - 1) / a.tile), unsigned(d.rows));
  return make_launch(reinterpret_cast<const void*>(&site_kernel), grid, dim3(kSiteThreads),
                     uint32_t(a.tile * sizeof(float)), a);
}

// Options::skip's "site_kernel@<pre>" (a leave-one-out diagnostic): the pre-op of a site_kernel launch, -1 for others.
int site_launch_pre(const Launch& l) {
  if (l.func != reinterpret_cast<const void*>(&site_kernel) || l.size != sizeof(SiteArgs)) return -1;
  SiteArgs a;
  std::memcpy(&a, l.args, sizeof a);
  return a.pre;
}

// ================================ dp4a matvec =====================================================
// v2: persistent, software-pipelined. Work unit = a row PAIR (the pair shares the activation loads);
// each warp owns a contiguous range of pairs (contiguous rows: sequential DRAM pages) and walks their
// 16-byte chunks lane-parallel (32 chunks = 512 B of a row per step), keeping kMvDepth steps of loads in
// flight: a ring of registers refilled right after use, so loads never stop while the warp computes.
// v1 (one short-lived block per 16 rows, one DRAM round trip each) reached 22-40 % of the probe.

namespace {

struct TOut {
  const uint32_t* words;
  const uint16_t* scales;
  float* y;
  int64_t N;
  int64_t g0;  // first row pair (matvec) or first block (GEMM) of this output
};
// Byte ranges the M = 1 matvec prefetches into L2 once its own rows are done (matvec_set_prefetch).
constexpr int kMaxPrefetch = 2 * kMaxOuts;  // words and scales of each output
struct TernaryArgs {
  TOut o[kMaxOuts];
  const int8_t* xq;
  const float2* xds;
  const unsigned char* pf_p[kMaxPrefetch];  // [pf_bytes[i]] each, device memory (weights of the next matvec)
  int64_t pf_bytes[kMaxPrefetch];           // 0: unused slot
  int64_t K, M;
  int64_t total, per_warp;  // matvec: row groups in all, row groups per warp (0: balanced over the blocks)
  int64_t part_stride;      // GEMM split-K: floats between the partial outputs of consecutive K slices
  int32_t n_outs, ks;       // GEMM split-K: K slices (blockIdx.z); 1 = no split
  WarpSite site;            // matvec, M = 1: when active, every block computes xq / xds itself (warp_site.cuh)
};

constexpr int kMvWarps = 8;

__device__ __forceinline__ int output_of(const TernaryArgs& a, int64_t g) {
  int o = 0;
#pragma unroll
  for (int i = 1; i < kMaxOuts; ++i)
    if (i < a.n_outs && g >= a.o[i].g0) o = i;
  return o;
}

template <int R>
struct MvStage {
  uint4 w[R];
  float s[R];
};

// R rows per warp step (a row group), D steps in flight per lane, LV int8 digits per activation element
// (1: q8, 2: q16; the weight bytes are masked once and meet both digit planes: chunk_dot2).
template <int MT, int R, int D, int LV = 1, bool SITE = false>
__global__ __launch_bounds__(kMvWarps * 32, 2) void matvec_kernel(const TernaryArgs a) {
  extern __shared__ __align__(16) unsigned char mv_smem[];  // SITE: xq [K] int8 | xds [K/64] float2
  const int lane = threadIdx.x & 31;
  const int64_t warp = int64_t(blockIdx.x) * kMvWarps + (threadIdx.x >> 5);
  const int64_t C = a.K >> 6, G = a.K >> 7;
  const int L = int((C + 31) >> 5);  // steps per row group
  int64_t g_begin, g_end;
  if (a.per_warp > 0) {  // fixed ranges (BONSAI_CUDA_MATVEC_BALANCE=0)
    g_begin = warp * a.per_warp;
    g_end = min(a.total, g_begin + a.per_warp);
  } else {  // the groups split evenly over the blocks (one per resident slot), then over the block's warps
    const int64_t nb = gridDim.x, b0 = a.total * blockIdx.x / nb, n = a.total * (blockIdx.x + 1) / nb - b0;
    const int w = threadIdx.x >> 5;
    g_begin = b0 + n * w / kMvWarps;
    g_end = b0 + n * (w + 1) / kMvWarps;
  }
  const int64_t steps = g_end > g_begin ? (g_end - g_begin) * L : 0;
  const int64_t m0 = int64_t(blockIdx.y) * MT;

  MvStage<R> ring[D];
  // Issue cursor: the group's row pointers are set once per group (every L steps), not per step.
  int64_t ig = g_begin;
  int ic = 0, nrows = 0;
  const uint4* wrow = nullptr;
  const __half* srow = nullptr;
  auto set_group = [&]() {
    if (ig >= g_end) return;
    const TOut& O = a.o[output_of(a, ig)];
    const int64_t row = int64_t(R) * (ig - O.g0);
    nrows = int(O.N - row < R ? O.N - row : int64_t(R));
    wrow = reinterpret_cast<const uint4*>(O.words) + row * C + lane;
    srow = reinterpret_cast<const __half*>(O.scales) + row * G;
  };
  auto issue = [&](MvStage<R>& st) {
    const int64_t c = lane + 32 * ic;
    const bool live = ig < g_end && c < C;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (live && r < nrows) {
        st.w[r] = ld_stream(wrow + r * C + 32 * ic);
        st.s[r] = __half2float(srow[r * G + (c >> 1)]);
      } else {
        st.w[r] = make_uint4(0, 0, 0, 0);
        st.s[r] = 0.f;
      }
    }
    if (ig < g_end && ++ic == L) {
      ic = 0;
      ++ig;
      set_group();
    }
  };

  pdl_trigger();
  set_group();
#pragma unroll
  for (int s = 0; s < D; ++s) issue(ring[s]);  // weights first: they do not depend on earlier kernels
  pdl_wait();                                   // the activations and y do
  const int8_t* xqp = a.xq;
  const float2* xdsp = a.xds;
  if constexpr (SITE) {  // the activation site of this matvec's input, computed here (weights in flight)
    int8_t* xq_s = reinterpret_cast<int8_t*>(mv_smem);
    float2* xds_s = reinterpret_cast<float2*>(mv_smem + a.K);
    for (int64_t c = threadIdx.x >> 5; c < (a.K >> 10); c += kMvWarps) warp_site_chunk(a.site, c << 10, lane, xq_s, xds_s);
    __syncthreads();
    xqp = xq_s;
    xdsp = xds_s;
  }

  float acc[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.f;
  int64_t cg = g_begin;  // compute cursor
  int cc = 0;
  // MT == 1: the activation chunk of the NEXT step is loaded while this step computes (double buffer,
  // D even so the buffer index is static); ncu showed 38 % of the stalls on these L1 loads otherwise.
  // q16: one buffer, loaded at the step (two planes double-buffered spill at the 128-register cap).
  constexpr int NB = LV == 1 ? 2 : 1;
  int4 xb[NB][LV][4];  // [buffer][digit plane][16 B piece of the chunk]
  float2 db[NB];
  auto load_x = [&](int buf, int step_in_group) {
    const int64_t c = lane + 32 * step_in_group;
    if (c < C) {
#pragma unroll
      for (int l = 0; l < LV; ++l) {
        const int4* xp = reinterpret_cast<const int4*>(xqp + l * a.K) + c * 4;
#pragma unroll
        for (int k = 0; k < 4; ++k) xb[buf][l][k] = xp[k];
      }
      db[buf] = xdsp[c];
    }
  };
  // sum(code * Q) over one chunk: Q = q (LV = 1) or 254 q0 + q1 (LV = 2).
  auto dot = [&](const uint4 w, const int4 (&x)[LV][4]) {
    if constexpr (LV == 2) return chunk_dot2(w, x[0], x[1]);
    else return chunk_dot(w, x[0][0], x[0][1], x[0][2], x[0][3]);
  };
  if constexpr (MT == 1 && NB == 2) {
    if (steps > 0) load_x(0, 0);
  }
  for (int64_t base = 0; base < steps; base += D) {
#pragma unroll
    for (int s = 0; s < D; ++s) {
      if (base + s < steps) {  // uniform across the warp
        const int64_t c = lane + 32 * cc;
        if constexpr (MT == 1) {
          if constexpr (NB == 2) {
            if (base + s + 1 < steps) load_x((s + 1) & 1, cc + 1 == L ? 0 : cc + 1);
          } else {
            load_x(0, cc);
          }
          const int b = NB == 2 ? (s & 1) : 0;  // static after unrolling
          if (c < C) {
            const float2 ds = db[b];
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][0] += ring[s].s[r] * ds.x * (float(dot(ring[s].w[r], xb[b])) - ds.y);
          }
        } else if (c < C) {
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            if (m0 + m < a.M) {
              int4 xm[LV][4];
#pragma unroll
              for (int l = 0; l < LV; ++l) {
                const int4* xp = reinterpret_cast<const int4*>(a.xq + ((m0 + m) * LV + l) * a.K) + c * 4;
#pragma unroll
                for (int k = 0; k < 4; ++k) xm[l][k] = xp[k];
              }
              const float2 ds = a.xds[(m0 + m) * C + c];
#pragma unroll
              for (int r = 0; r < R; ++r) acc[r][m] += ring[s].s[r] * ds.x * (float(dot(ring[s].w[r], xm)) - ds.y);
            }
          }
        }
        issue(ring[s]);  // refill: the step D ahead
        if (++cc == L) {  // the group is done: reduce across the warp and write
          const TOut& O = a.o[output_of(a, cg)];
          const int64_t row = int64_t(R) * (cg - O.g0);
#pragma unroll
          for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int r = 0; r < R; ++r) {
              const float v = warp_sum(acc[r][m]);
              if (lane == 0 && m0 + m < a.M && row + r < O.N) O.y[(m0 + m) * O.N + row + r] = v;
              acc[r][m] = 0.f;
            }
          cc = 0;
          ++cg;
        }
      }
    }
  }
  // This warp's loads are all issued and consumed: prefetch its share of the next matvec's weights into
  // L2, so the DRAM streams them while the latency-bound small kernels in between run (it idles there).
  const int64_t nw = int64_t(gridDim.x) * kMvWarps;
#pragma unroll 1
  for (int i = 0; i < kMaxPrefetch; ++i) {
    const int64_t lines = (a.pf_bytes[i] + 127) >> 7;
    const int64_t l1 = lines * (warp + 1) / nw;
    for (int64_t l = lines * warp / nw + lane; l < l1; l += 32)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(a.pf_p[i] + (l << 7)));
  }
}

__device__ __forceinline__ int find_output(const TernaryArgs& a) { return output_of(a, int64_t(blockIdx.x)); }

// The matvec instance for R rows per step and MT tokens per pass (depths as measured: R = 2 with 4-6
// steps in flight, R = 4 with 2-3).
// q16 with several tokens has R = 2 only (matvec_launch: 4 rows spill).
template <int L>
const void* matvec_kernel_for(int R, int mt) {
  if (R == 2) {
    if (mt == 1) return reinterpret_cast<const void*>(&matvec_kernel<1, 2, 4, L>);
    if (mt == 2) return reinterpret_cast<const void*>(&matvec_kernel<2, 2, 6, L>);
    return reinterpret_cast<const void*>(&matvec_kernel<4, 2, 6, L>);
  }
  if (mt == 1) return reinterpret_cast<const void*>(&matvec_kernel<1, 4, 2, L>);
  if constexpr (L == 1) {
    if (mt == 2) return reinterpret_cast<const void*>(&matvec_kernel<2, 4, 3, L>);
    return reinterpret_cast<const void*>(&matvec_kernel<4, 4, 3, L>);
  }
  return nullptr;
}

}  // namespace

bool matvec_site_supported(int64_t K, int64_t n, int32_t pre, int64_t seg) {
  return K % 1024 == 0 && K <= 32768 && n >= 1 && n <= 1024 && (n & (n - 1)) == 0 &&
         (pre == kPreNone || pre == kPreSiluMul || pre == kPreSigmoidMul ||
          (pre == kPreGatedNorm && seg % 32 == 0 && seg <= 1024 && 1024 % seg == 0));
}

Launch matvec_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds, int64_t M,
                     int levels, int sms, int rows, const SiteDesc* site, bool balanced) {
  const int mt = M <= 1 ? 1 : M <= 2 ? 2 : 4;  // tokens per pass
  const bool fused_site = site && M == 1 && levels == 1;
  // q16 with several tokens: 2 rows per step (4 rows spill at the 128-register cap).
  const int R = rows == 4 && (levels == 1 || mt == 1) ? 4 : 2;
  TernaryArgs a{};
  a.xq = xq;
  a.xds = xds;
  a.K = K;
  a.M = M;
  a.n_outs = n_outs;
  int64_t g0 = 0;
  for (int i = 0; i < n_outs; ++i) {
    a.o[i] = {outs[i].words, outs[i].scales, outs[i].y, outs[i].N, g0};
    g0 += (outs[i].N + R - 1) / R;
  }
  a.total = g0;
  // At most 2 blocks of 8 warps per SM resident (the register budget).
  const int64_t slots = int64_t(sms) * 2, max_warps = slots * kMvWarps;
  int64_t blocks;
  if (balanced) {
    // One block per resident slot, the row groups split evenly over the blocks: every SM gets the same
    // rows +- 1 group. (Fixed per-warp ranges put 2 blocks on some SMs and 1 on others: ffn_down, 1,280
    // groups of 4 rows, ran 160 blocks, so 28 SMs carried 16 groups and the rest 8.)
    a.per_warp = 0;
    blocks = std::min(slots, a.total);
  } else {
    a.per_warp = (a.total + max_warps - 1) / max_warps;
    const int64_t warps = (a.total + a.per_warp - 1) / a.per_warp;
    blocks = (warps + kMvWarps - 1) / kMvWarps;
  }
  const dim3 grid(unsigned(std::max<int64_t>(blocks, 1)), unsigned((M + mt - 1) / mt));
  // The site as this kernel's prologue (reads site->src, writes no fp32 outputs); one digit only (q8).
  if (fused_site) {
    int log2n = 0;
    while ((int64_t(1) << log2n) < site->n) ++log2n;
    a.site = {site->src, site->src2, site->gain, site->signs, site->pre, log2n, site->seg, site->eps,
              float(1.0 / __builtin_sqrt(double(site->n))), 1, 0};
    const void* f = R == 2 ? reinterpret_cast<const void*>(&matvec_kernel<1, 2, 4, 1, true>)
                           : reinterpret_cast<const void*>(&matvec_kernel<1, 4, 2, 1, true>);
    return make_launch(f, grid, dim3(kMvWarps * 32), uint32_t(K + K / 64 * 8), a);
  }
  const void* f = levels == 2 ? matvec_kernel_for<2>(R, mt) : matvec_kernel_for<1>(R, mt);
  return make_launch(f, grid, dim3(kMvWarps * 32), 0, a);
}

bool matvec_set_prefetch(Launch& l, const TernaryDev* next, int n_next, int64_t K, uint64_t max_bytes) {
  // Only the M = 1 matvec instances prefetch (their grid has one token row).
  const void* const mt1[] = {reinterpret_cast<const void*>(&matvec_kernel<1, 2, 4, 1>),
                             reinterpret_cast<const void*>(&matvec_kernel<1, 4, 2, 1>),
                             reinterpret_cast<const void*>(&matvec_kernel<1, 2, 4, 2>),
                             reinterpret_cast<const void*>(&matvec_kernel<1, 4, 2, 2>),
                             reinterpret_cast<const void*>(&matvec_kernel<1, 2, 4, 1, true>),
                             reinterpret_cast<const void*>(&matvec_kernel<1, 4, 2, 1, true>)};
  if (l.size != sizeof(TernaryArgs) || std::find(std::begin(mt1), std::end(mt1), l.func) == std::end(mt1)) return false;
  if (n_next < 1 || n_next > kMaxOuts) return false;
  uint64_t total = 0;
  for (int i = 0; i < n_next; ++i) total += uint64_t(next[i].N) * uint64_t(K) / 4 + uint64_t(next[i].N) * uint64_t(K) / 64;
  if (total > max_bytes) return false;  // would evict its own first lines before they are read
  TernaryArgs a;
  std::memcpy(&a, l.args, sizeof a);
  for (int i = 0; i < kMaxPrefetch; ++i) {
    a.pf_p[i] = nullptr;
    a.pf_bytes[i] = 0;
  }
  for (int i = 0; i < n_next; ++i) {
    a.pf_p[2 * i] = reinterpret_cast<const unsigned char*>(next[i].words);  // u32 [N, K/16]
    a.pf_bytes[2 * i] = next[i].N * K / 4;
    a.pf_p[2 * i + 1] = reinterpret_cast<const unsigned char*>(next[i].scales);  // fp16 [N, K/128]
    a.pf_bytes[2 * i + 1] = next[i].N * K / 64;
  }
  std::memcpy(l.args, &a, sizeof a);
  return true;
}

// ================================ int8 tensor-core GEMM ===========================================
// Block: 8 warps, 128 weight rows (16 per warp) x 64 tokens (8 mma n-tiles of 8), or x 32 tokens for
// M <= 32. K advances one 128-group per stage (4 mma k-steps of 32), 2 (64 tokens) or 4 (32 tokens)
// stages in flight via cp.async. A fragments are decoded
// from the canonical words to signed int8 (code - 1) in registers; x is the transposed xq (the same
// permutation of k inside each 16 on both sides leaves the dot product unchanged). q16: the group's
// mmas run on digit plane 0, the int32 accumulators are multiplied by 254, then the plane-1 mmas add into
// them (same decoded A fragments). Per group the int32 accumulators are scaled by d_w[row] * u_x[token]
// into fp32 (u = the activation unit, d or d / 254).

namespace {

constexpr int kGemmRows = 128;
constexpr int kAStride = 12;    // words per weight row in shared memory (8 used): conflict-free A reads
constexpr int kXStride = 144;   // bytes per token row in shared memory (128 used): conflict-free B reads

template <int TOKS, int L>
struct GemmStage {
  uint32_t A[kGemmRows * kAStride];  // [rows][kAStride] canonical words of one 128-group (8 used per row)
  int8_t X[L][TOKS * kXStride];      // [digit plane][token][kXStride] transposed xq of the group (128 used)
  float2 xds[TOKS * 2];              // [token][chunk] {unit, digit sum} (only the unit is read)
};

__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// TOKS tokens per tile (64, or 32 for batched decode where M <= 32: no MMA work on padding), STAGES
// 128-groups in flight (cp.async multistage: the loads of group kg + STAGES - 1 are issued while group kg
// is computed), L int8 digits per activation element (1: q8, 2: q16, ternary.cu's header).
template <int WARPS, int TOKS, int STAGES, int L>
__global__ __launch_bounds__(WARPS * 32, 16 / WARPS) void gemm_kernel(const TernaryArgs a) {
  constexpr int NT = WARPS * 32, ROWS = WARPS * 16, NTILES = TOKS / 8;
  extern __shared__ __align__(16) unsigned char gemm_smem[];
  GemmStage<TOKS, L>* st = reinterpret_cast<GemmStage<TOKS, L>*>(gemm_smem);  // [STAGES] (dynamic: > 48 KB)
  const int o = find_output(a);
  const uint32_t* words = a.o[o].words;
  const __half* scales = reinterpret_cast<const __half*>(a.o[o].scales);
  const int64_t N = a.o[o].N, K = a.K, M = a.M;
  const int64_t KW = K / 16, G = K / 128, C = K / 64;
  // Split-K: this block's slice of the 128-groups [k0, k0 + NG); its partial goes to y + kz * part_stride.
  const int64_t kz = blockIdx.z, k0 = G * kz / a.ks, NG = G * (kz + 1) / a.ks - k0;
  float* y = a.o[o].y + kz * a.part_stride;
  const int64_t row0 = (int64_t(blockIdx.x) - a.o[o].g0) * ROWS;
  const int64_t tok0 = int64_t(blockIdx.y) * TOKS;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;

  auto issue_w = [&](int64_t kg, int s) {
#pragma unroll
    for (int id = tid; id < ROWS * 2; id += NT) {
      const int rr = id >> 1, hh = id & 1;
      const int64_t row = row0 + rr;
      const uint32_t* src = words + (row < N ? row : N - 1) * KW + (k0 + kg) * 8 + hh * 4;
      cp_async16(&st[s].A[rr * kAStride + hh * 4], src, row < N ? 16 : 0);
    }
  };
  auto issue_x = [&](int64_t kg, int s) {
#pragma unroll
    for (int id = tid; id < L * TOKS * 8; id += NT) {
      const int l = id / (TOKS * 8), tk = (id >> 3) % TOKS, part = id & 7;
      const int64_t tok = tok0 + tk;
      const int8_t* src = a.xq + ((tok < M ? tok : M - 1) * L + l) * K + (k0 + kg) * 128 + part * 16;
      cp_async16(&st[s].X[l][tk * kXStride + part * 16], src, tok < M ? 16 : 0);
    }
#pragma unroll
    for (int id = tid; id < TOKS * 2; id += NT) {
      const int tk = id >> 1, ch = id & 1;
      const int64_t tok = tok0 + tk;
      cp_async8(&st[s].xds[id], a.xds + (tok < M ? tok : M - 1) * C + (k0 + kg) * 2 + ch, tok < M ? 8 : 0);
    }
  };

  float facc[NTILES][4];
#pragma unroll
  for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) facc[nt][i] = 0.f;

  const int64_t rg = row0 + warp * 16 + g, rg8 = rg + 8;
  const __half* srg = scales + (rg < N ? rg : 0) * G + k0;
  const __half* srg8 = scales + (rg8 < N ? rg8 : 0) * G + k0;

  pdl_trigger();
  for (int s = 0; s < STAGES - 1; ++s)  // weights first: they do not depend on earlier kernels
    if (s < NG) issue_w(s, s);
  pdl_wait();
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < NG) issue_x(s, s);
    cp_async_commit();  // one group per stage (the first also holds the early weight loads)
  }

  for (int64_t kg = 0; kg < NG; ++kg) {
    const int s = int(kg % STAGES);
    cp_async_wait<STAGES - 2>();  // group kg has landed
    __syncthreads();              // ... for every thread; and slot (kg - 1) % STAGES is free to refill
    if (kg + STAGES - 1 < NG) {
      const int sn = int((kg + STAGES - 1) % STAGES);
      issue_w(kg + STAGES - 1, sn);
      issue_x(kg + STAGES - 1, sn);
    }
    cp_async_commit();
    const GemmStage<TOKS, L>& S = st[s];
    int cacc[NTILES][4];
#pragma unroll
    for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) cacc[nt][i] = 0;
    // The group's A fragments: decoded once per k-step (4 registers) and used for every digit plane.
    uint32_t af[4][4];
    auto decode_a = [&](int ks) {
      const uint32_t* Ar = &S.A[(warp * 16 + g) * kAStride + 2 * ks];
      const uint32_t* Ar8 = Ar + 8 * kAStride;
      af[ks][0] = decode4(Ar[0] >> (2 * q));
      af[ks][1] = decode4(Ar8[0] >> (2 * q));
      af[ks][2] = decode4(Ar[1] >> (2 * q));
      af[ks][3] = decode4(Ar8[1] >> (2 * q));
    };
#pragma unroll
    for (int l = 0; l < L; ++l) {
      // q16: the int32 accumulators of digit 0 times 254, then digit 1 added: 254 I0 + I1 exactly
      // (|254 I0 + I1| <= 128 * 127 * 255 < 2^22).
      if (l == 1)
#pragma unroll
        for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) cacc[nt][i] *= 254;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        if (l == 0) decode_a(ks);  // plane 1 reuses the fragments of plane 0
#pragma unroll
        for (int nt = 0; nt < NTILES; ++nt) {
          const int8_t* xb = &S.X[l][(nt * 8 + g) * kXStride + ks * 32 + 4 * q];
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(xb);
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(xb + 16);
          mma_s8(cacc[nt], af[ks][0], af[ks][1], af[ks][2], af[ks][3], b0, b1);
        }
      }
    }
    const float dw = __half2float(srg[kg]), dw8 = __half2float(srg8[kg]);
#pragma unroll
    for (int nt = 0; nt < NTILES; ++nt) {
      const float dx0 = S.xds[(nt * 8 + 2 * q) * 2].x, dx1 = S.xds[(nt * 8 + 2 * q + 1) * 2].x;
      facc[nt][0] += dw * dx0 * float(cacc[nt][0]);
      facc[nt][1] += dw * dx1 * float(cacc[nt][1]);
      facc[nt][2] += dw8 * dx0 * float(cacc[nt][2]);
      facc[nt][3] += dw8 * dx1 * float(cacc[nt][3]);
    }
  }

#pragma unroll
  for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = i < 2 ? rg : rg8;
      const int64_t tok = tok0 + nt * 8 + 2 * q + (i & 1);
      if (row < N && tok < M) y[tok * N + row] = facc[nt][i];
    }
}

// Stages in flight (dynamic shared memory, so deeper rings can be tried without the 48 KB static cap).
// Measured on the H200 (docs/cuda-kernels.md, round 3): 6 / 8 stages changed nothing at M = 32 / 64 and
// made M = 256 slower (209 -> 377 us for ffn_down): the GEMM is bound by its per-MMA instruction
// overhead (A decode, per-group scaling, fragment loads), not by load latency.
constexpr int kGemmStages64 = 2, kGemmStages32 = 4;

template <int L>
const void* gemm_kernel_for(int warps, bool small) {
  return small ? (warps == 4 ? reinterpret_cast<const void*>(&gemm_kernel<4, 32, kGemmStages32, L>)
                             : reinterpret_cast<const void*>(&gemm_kernel<8, 32, kGemmStages32, L>))
               : (warps == 4 ? reinterpret_cast<const void*>(&gemm_kernel<4, 64, kGemmStages64, L>)
                             : reinterpret_cast<const void*>(&gemm_kernel<8, 64, kGemmStages64, L>));
}
const void* gemm_kernel_for(int levels, int warps, bool small) {
  return levels == 2 ? gemm_kernel_for<2>(warps, small) : gemm_kernel_for<1>(warps, small);
}
// Dynamic shared memory of one GEMM block: its ring of stages.
uint32_t gemm_smem_bytes(int levels, bool small) {
  if (levels == 2) return uint32_t(small ? sizeof(GemmStage<32, 2>) * kGemmStages32 : sizeof(GemmStage<64, 2>) * kGemmStages64);
  return uint32_t(small ? sizeof(GemmStage<32, 1>) * kGemmStages32 : sizeof(GemmStage<64, 1>) * kGemmStages64);
}

}  // namespace

void init_gemm_attributes() {
  for (int l : {1, 2})
    for (int w : {4, 8})
      for (bool small : {false, true})
        cudaFuncSetAttribute(gemm_kernel_for(l, w, small), cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(gemm_smem_bytes(l, small)));
}

namespace {
// The GEMM's block shape for M tokens: tokens per tile, 8 or 4 warps (128 / 64 rows), blocks before split-K.
struct GemmShape {
  bool small;
  int64_t ty;
  int warps;
  int64_t blocks;
};
GemmShape gemm_shape(const TernaryDev* outs, int n_outs, int64_t M, int sms) {
  GemmShape g;
  g.small = M <= 32;  // batched decode: 32-token tiles, kGemmStages32 (else 64 tokens, kGemmStages64)
  g.ty = (M + (g.small ? 31 : 63)) / (g.small ? 32 : 64);
  int64_t tiles8 = 0;
  for (int i = 0; i < n_outs; ++i) tiles8 += (outs[i].N + 127) / 128;
  g.warps = tiles8 * g.ty < 2 * sms ? 4 : 8;
  g.blocks = 0;
  for (int i = 0; i < n_outs; ++i) g.blocks += (outs[i].N + 16 * g.warps - 1) / (16 * g.warps) * g.ty;
  return g;
}
}  // namespace

int gemm_ksplit(const TernaryDev* outs, int n_outs, int64_t K, int64_t M, int sms, bool waves) {
  // Few output rows and a long K (the FFN down projection: 5,120 rows, K = 17,408): the grid fills a
  // fraction of the resident block slots (8-warp blocks: 2 per SM, 4-warp: 4), each block walking up to
  // 136 groups. Split K to fill the slots, each slice >= 16 groups.
  const GemmShape g = gemm_shape(outs, n_outs, M, sms);
  const int64_t G = K / 128, slots = int64_t(sms) * (g.warps == 4 ? 4 : 2);
  if (G < 32) return 1;
  if (!waves) {
    if (2 * g.blocks > slots) return 1;
    const int64_t ks = std::min<int64_t>({slots / g.blocks, 8, G / 16});
    return int(std::max<int64_t>(ks, 1));
  }
  // Wave-aware: the time is ~ rounds of resident blocks, ceil(blocks * ks / slots), each 1/ks of a full-K
  // block. A grid just over the slots (gate+up at M <= 64: 272 blocks on 264 slots) runs a second round
  // for 8 blocks; two K slices make it 3 rounds of half-blocks (1.5 instead of 2). A split is taken when it
  // saves >= 15 % (it adds the ordered sum of the slices).
  int64_t best = 1;
  double best_t = double((g.blocks + slots - 1) / slots);
  for (int64_t ks = 2; ks <= std::min<int64_t>(8, G / 16); ++ks) {
    const double t = double((g.blocks * ks + slots - 1) / slots) / double(ks);
    if (t < 0.85 * best_t) best = ks, best_t = t;
  }
  return int(best);
}

Launch gemm_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds, int64_t M,
                   int levels, int sms, int ks, int64_t part_stride) {
  TernaryArgs a{};
  a.xq = xq;
  a.xds = xds;
  a.K = K;
  a.M = M;
  a.n_outs = n_outs;
  a.ks = ks;
  a.part_stride = part_stride;
  const GemmShape gs = gemm_shape(outs, n_outs, M, sms);
  const bool small = gs.small;
  const int64_t ty = gs.ty;
  const int warps = gs.warps;
  const int64_t rows = 16 * warps;
  int64_t b0 = 0;
  for (int i = 0; i < n_outs; ++i) {
    a.o[i] = {outs[i].words, outs[i].scales, outs[i].y, outs[i].N, b0};
    b0 += (outs[i].N + rows - 1) / rows;
  }
  const dim3 grid{unsigned(b0), unsigned(ty), unsigned(ks)};
  const int lv = levels == 2 ? 2 : 1;
  return make_launch(gemm_kernel_for(lv, warps, small), grid, dim3(unsigned(32 * warps)), gemm_smem_bytes(lv, small), a);
}

// ================================ exact-activation product ========================================
// Options::exact: y = x W^T with x fp32 as it is (no int8 step). One warp per weight row; lane l takes
// words l, l + 32, ...; 4 tokens per pass share the decoded weights; fp32 accumulation of fp32 products
// (w = (code - 1) * d is exact in fp32). Written for parity, not speed.

namespace {

struct ExactArgs {
  TOut o[kMaxOuts];
  const float* x;
  int64_t K, M, total;  // total: rows of all outputs
  int32_t n_outs, pad;
};

constexpr int kExWarps = 8;

__global__ __launch_bounds__(kExWarps * 32) void exact_linear_kernel(const ExactArgs a) {
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int64_t g = int64_t(blockIdx.x) * kExWarps + (threadIdx.x >> 5);
  if (g >= a.total) return;
  int o = 0;
#pragma unroll
  for (int i = 1; i < kMaxOuts; ++i)
    if (i < a.n_outs && g >= a.o[i].g0) o = i;
  const TOut& O = a.o[o];
  const int64_t row = g - O.g0;
  const int64_t nw = a.K / 16;
  const uint32_t* wr = O.words + row * nw;
  const __half* sr = reinterpret_cast<const __half*>(O.scales) + row * (a.K / 128);
  for (int64_t m0 = 0; m0 < a.M; m0 += 4) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int64_t i = lane; i < nw; i += 32) {
      const uint32_t w = wr[i];
      const float d = __half2float(sr[i >> 3]);
      float wv[16];
#pragma unroll
      for (int e = 0; e < 16; ++e) wv[e] = float(int((w >> (2 * e)) & 3u) - 1) * d;
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        if (m0 + t >= a.M) break;
        const float4* xp = reinterpret_cast<const float4*>(a.x + (m0 + t) * a.K + 16 * i);
        float s = 0.f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float4 v = xp[q];
          s += wv[4 * q] * v.x + wv[4 * q + 1] * v.y + wv[4 * q + 2] * v.z + wv[4 * q + 3] * v.w;
        }
        acc[t] += s;
      }
    }
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const float v = warp_sum(acc[t]);
      if (lane == 0 && m0 + t < a.M) O.y[(m0 + t) * O.N + row] = v;
    }
  }
}

}  // namespace

Launch exact_linear_launch(const TernaryDev* outs, int n_outs, int64_t K, const float* x, int64_t M) {
  ExactArgs a{};
  a.x = x;
  a.K = K;
  a.M = M;
  a.n_outs = n_outs;
  int64_t r0 = 0;
  for (int i = 0; i < n_outs; ++i) {
    a.o[i] = {outs[i].words, outs[i].scales, outs[i].y, outs[i].N, r0};
    r0 += outs[i].N;
  }
  a.total = r0;
  return make_launch(reinterpret_cast<const void*>(&exact_linear_kernel), dim3(unsigned((r0 + kExWarps - 1) / kExWarps)),
                     dim3(kExWarps * 32), 0, a);
}

void init_kernel_attributes() {
  static bool done = false;
  if (done) return;
  done = true;
  cudaFuncSetAttribute(reinterpret_cast<const void*>(&site_kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                       int(kMaxHadamardBlock * sizeof(float)));
  // the row-unit warp site's staging tiles: up to 20 chunks of [32][33] floats (84 KB)
  cudaFuncSetAttribute(reinterpret_cast<const void*>(&site_warp_kernel<true, true>),
                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSiteRowUnitsMaxChunks * 32 * 33 * sizeof(float)));
  // round 28's pipelined form: its load and store tiles (site_rows_pipe_smem), up to the opt-in limit
  for (const void* f : {reinterpret_cast<const void*>(&site_warp_rows_kernel<1>),
                        reinterpret_cast<const void*>(&site_warp_rows_kernel<2>)})
    cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSiteRowsPipeMaxSmem));
  init_matvec_bulk_attributes();
  init_attention_attributes();
  init_gemm_attributes();
  init_gemm2_attributes();
  init_gemm3_attributes();
  init_gemmh_attributes();
  init_ffn_fused_attributes();
  init_delta_out_attributes();
}

}  // namespace bonsai::cuda
