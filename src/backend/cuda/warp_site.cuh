// The activation site of ONE row computed by one warp per 1024 elements, in registers: pre-op, sign,
// blockwise FWHT (n <= 1024), 1/sqrt(n), int8 quantisation per 128-group in the transposed layout the
// ternary kernels read (ternary.cu's header). Used as the prologue of the M = 1 matvec (every block
// computes the site of its own input, no site kernel and no dependency hop in between).
//
// Lane l holds elements 32 l .. 32 l + 31 of the 1024-chunk: butterflies at stride h < 32 stay inside
// the lane's registers, strides 32..512 pair lane l with lane l ^ (h / 32) through shuffles. Every
// element goes through the same operations in the same order as site_kernel (stages h = 1, 2, 4, ...,
// a + b / a - b, then * norm; the same quantiser), so the int8 activation is bit-identical to the
// unfused path for the elementwise pre-ops (the gated norm's sum of squares is summed in another order).
#pragma once
#include <cstdint>

#include "backend/cuda/common.cuh"

namespace bonsai::cuda {

// Kernel-argument form of a site fused into a consumer (POD, no padding holes).
struct WarpSite {
  const float* src;     // [K] the row (pre-op first operand)
  const float* src2;    // [K] pre-op second operand (SiluMul: up, SigmoidMul: gate, GatedNorm: z) or null
  const float* gain;    // [seg] GatedNorm gain or null
  const int8_t* signs;  // [K] +-1 applied before the transform, or null
  int32_t pre;          // PreOp: kPreNone, kPreSiluMul, kPreSigmoidMul, kPreGatedNorm
  int32_t log2n;        // Hadamard block n = 1 << log2n, 0..10
  int32_t seg;          // GatedNorm segment (a multiple of 32, <= 1024)
  float eps, norm;      // GatedNorm eps; 1/sqrt(n)
  int32_t active, pad;  // active = 0: no fused site (the consumer reads a ready int8 activation)
};

// Chunk [c0, c0 + 1024) of the row -> xq [c0 .. c0+1024) int8 and xds [c0/64 .. c0/64 + 16) (smem or
// global). All 32 lanes of the warp call it together.
__device__ __forceinline__ void warp_site_chunk(const WarpSite& s, int64_t c0, int lane, int8_t* xq, float2* xds) {
  const int64_t base = c0 + 32 * lane;
  float v[32];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float4 f = *reinterpret_cast<const float4*>(s.src + base + 4 * k);
    v[4 * k] = f.x, v[4 * k + 1] = f.y, v[4 * k + 2] = f.z, v[4 * k + 3] = f.w;
  }
  if (s.pre == kPreSiluMul || s.pre == kPreSigmoidMul || s.pre == kPreGatedNorm) {
    float u[32];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float4 f = *reinterpret_cast<const float4*>(s.src2 + base + 4 * k);
      u[4 * k] = f.x, u[4 * k + 1] = f.y, u[4 * k + 2] = f.z, u[4 * k + 3] = f.w;
    }
    if (s.pre == kPreSiluMul) {
#pragma unroll
      for (int j = 0; j < 32; ++j) v[j] = siluf_(v[j]) * u[j];
    } else if (s.pre == kPreSigmoidMul) {
#pragma unroll
      for (int j = 0; j < 32; ++j) v[j] = v[j] * sigmoidf_(u[j]);
    } else {  // rmsnorm over each seg-long segment (seg / 32 adjacent lanes) * gain * silu(z)
      float ss = 0.f;
#pragma unroll
      for (int j = 0; j < 32; ++j) ss += v[j] * v[j];
      for (int o = 1; o < s.seg / 32; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      const float rr = rsqrtf(ss / float(s.seg) + s.eps);
      const int64_t g0 = base % s.seg;
#pragma unroll
      for (int j = 0; j < 32; ++j) v[j] = v[j] * rr * s.gain[g0 + j] * siluf_(u[j]);
    }
  }
  if (s.signs) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const char4 g = *reinterpret_cast<const char4*>(s.signs + base + 4 * k);
      v[4 * k] *= float(g.x), v[4 * k + 1] *= float(g.y), v[4 * k + 2] *= float(g.z), v[4 * k + 3] *= float(g.w);
    }
  }
  // FWHT of every n-block: strides 1..16 in registers, 32..512 across lanes.
  const int n = 1 << s.log2n;
#pragma unroll
  for (int h = 1; h < 32; h <<= 1) {
    if (h < n) {
#pragma unroll
      for (int j = 0; j < 32; ++j)
        if ((j & h) == 0) {
          const float a = v[j], b = v[j + h];
          v[j] = a + b;
          v[j + h] = a - b;
        }
    }
  }
  for (int h = 32; h < n; h <<= 1) {
    const int m = h / 32;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const float p = __shfl_xor_sync(0xffffffffu, v[j], m);
      v[j] = (lane & m) ? p - v[j] : v[j] + p;
    }
  }
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    v[j] *= s.norm;
    amax = fmaxf(amax, fabsf(v[j]));
  }
  // int8 per 128-group (4 lanes), as site_kernel: d = amax / 127, q = clamp(rint(v * 127 / amax)).
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  uint32_t packed[8];  // the lane's 32 bytes in transposed order: element 16w + 4b + t -> byte 16w + 4t + b
#pragma unroll
  for (int k = 0; k < 8; ++k) packed[k] = 0;
  int sum = 0;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int q = max(-127, min(127, __float2int_rn(v[j] * inv)));
    sum += q;
    const int w = j >> 4, b = (j >> 2) & 3, t = j & 3, pos = 16 * w + 4 * t + b;
    packed[pos >> 2] |= uint32_t(q & 0xff) << (8 * (pos & 3));
  }
  uint4* dst = reinterpret_cast<uint4*>(xq + base);
  dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);  // a 64-chunk is two lanes
  if ((lane & 1) == 0) xds[base >> 6] = make_float2(amax / 127.f, float(sum));
}

// ---- the site as the prologue of matvec v7 (round 11; q16 and q8) ------------------------------------------------
// The consumer warps of every v7 block compute the whole row's site into shared memory after griddepcontrol.wait,
// while the producer warp's weight copies (issued before the wait) fill the ring: the site kernel and its hop on the
// decode chain go. One warp per 1024-element chunk as site_warp_kernel (lane l: elements 32 l .. 32 l + 31; the
// packs' Hadamard block is 1024), so a 5,120-wide row is 5 warps' work and no barrier sits inside a chunk. Same
// operations in the same order as site_warp_kernel / site_kernel (pre-op, signs, butterflies a + b / a - b at h = 1,
// 2, 4, ..., * norm, the same quantiser), so xq / xds are bit-identical to the site kernel's for the elementwise
// pre-ops; the norms' sums of squares are summed in another order.
// AddNorm: h += delta is needed by every block, and h is read by all of them, so no block may write it until all
// have read it: each block's consumers count themselves in (count[0]) after their prologue, and each block's
// producer warp, once its last copy is issued, waits for all of them and writes ITS slice of h (count[1] then
// counts departures; the last one zeroes both). The grid is at most one block per SM, all resident: the wait ends.
// Block 0 writes the normed row (pre_out, read later by the GDN a/b projections); the rotated fp32 site is not
// written (the forward reads it only through this product).
struct SitePrologue {
  const float* src;      // [K] the pre-op's first operand (AddNorm: delta, or the row itself without resid)
  const float* src2;     // [K] SiluMul: up, SigmoidMul: gate, GatedNorm: z; else null
  const float* gain;     // AddNorm [K] / GatedNorm [seg] gain, else null
  float* resid;          // AddNorm: h [K] (+= src, each block a slice once all have read it), or null
  float* pre_out;        // AddNorm: the normed row [K], written by block 0, or null
  const int8_t* signs;   // [K] +-1 applied before the transform, or null
  int32_t* count;        // AddNorm with resid: int32 [2] {prologues done, slices written}, zero between launches
  int32_t pre;           // PreOp: kPreNone, kPreSiluMul, kPreSigmoidMul, kPreGatedNorm, kPreAddNorm
  int32_t log2n;         // Hadamard block n = 1 << log2n, 0..10 (n <= 1024: one chunk)
  int32_t seg;           // GatedNorm segment: a multiple of 32 dividing 1024
  int32_t active;        // 0: no site (the kernel reads a ready int8 activation); 2: timing only, no site computed
  float eps, norm;       // norm eps; 1/sqrt(n)
};

__device__ __forceinline__ void load32(const float* p, float (&v)[32]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float4 f = *reinterpret_cast<const float4*>(p + 4 * k);
    v[4 * k] = f.x, v[4 * k + 1] = f.y, v[4 * k + 2] = f.z, v[4 * k + 3] = f.w;
  }
}

// Chunk [c0, c0 + 1024) of the row -> xq (LV digit planes of K bytes, transposed words) and xds [K/64] in shared
// memory. rr: AddNorm's 1 / rms of the row. All 32 lanes call it together.
template <int LV>
__device__ __forceinline__ void site_chunk1024(const SitePrologue& s, int K, int c0, int lane, float rr, bool write_pre,
                                               int8_t* xq, float2* xds) {
  const int e0 = c0 + 32 * lane;
  float v[32];
  load32(s.src + e0, v);
  if (s.pre == kPreAddNorm) {  // v = src (+ resid); v * rr * gain (site_kernel's order)
    if (s.resid) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float4 f = *reinterpret_cast<const float4*>(s.resid + e0 + 4 * k);
        v[4 * k] += f.x, v[4 * k + 1] += f.y, v[4 * k + 2] += f.z, v[4 * k + 3] += f.w;
      }
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float4 g = *reinterpret_cast<const float4*>(s.gain + e0 + 4 * k);
      v[4 * k] = v[4 * k] * rr * g.x, v[4 * k + 1] = v[4 * k + 1] * rr * g.y;
      v[4 * k + 2] = v[4 * k + 2] * rr * g.z, v[4 * k + 3] = v[4 * k + 3] * rr * g.w;
    }
    if (write_pre) {
      float4* po = reinterpret_cast<float4*>(s.pre_out + e0);
#pragma unroll
      for (int k = 0; k < 8; ++k) po[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
    }
  } else if (s.pre != kPreNone) {  // the second operand a float4 at a time (registers: v[] stays the only array)
    float r = 1.f;
    if (s.pre == kPreGatedNorm) {  // rmsnorm over each seg-long segment (seg / 32 adjacent lanes) * gain * silu(z)
      float ss = 0.f;
#pragma unroll
      for (int j = 0; j < 32; ++j) ss += v[j] * v[j];
      for (int o = 1; o < s.seg / 32; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      r = rsqrtf(ss / float(s.seg) + s.eps);
    }
    const int g0 = s.pre == kPreGatedNorm ? e0 % s.seg : 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float4 f = *reinterpret_cast<const float4*>(s.src2 + e0 + 4 * k);
      const float u[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int j = 4 * k + i;
        if (s.pre == kPreSiluMul) v[j] = siluf_(v[j]) * u[i];
        else if (s.pre == kPreSigmoidMul) v[j] = v[j] * sigmoidf_(u[i]);
        else v[j] = v[j] * r * s.gain[g0 + j] * siluf_(u[i]);
      }
    }
  }
  if (s.signs) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const char4 g = *reinterpret_cast<const char4*>(s.signs + e0 + 4 * k);
      v[4 * k] *= float(g.x), v[4 * k + 1] *= float(g.y), v[4 * k + 2] *= float(g.z), v[4 * k + 3] *= float(g.w);
    }
  }
  const int n = 1 << s.log2n;
#pragma unroll
  for (int h = 1; h < 32; h <<= 1) {
    if (h < n) {
#pragma unroll
      for (int j = 0; j < 32; ++j)
        if ((j & h) == 0) {
          const float a = v[j], b = v[j + h];
          v[j] = a + b;
          v[j + h] = a - b;
        }
    }
  }
  for (int h = 32; h < n; h <<= 1) {
    const int m = h / 32;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const float p = __shfl_xor_sync(0xffffffffu, v[j], m);
      v[j] = (lane & m) ? p - v[j] : v[j] + p;
    }
  }
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    v[j] *= s.norm;
    amax = fmaxf(amax, fabsf(v[j]));
  }
  // Per 128-group (4 lanes), the site kernel's quantiser: d = amax / 127, q0 = rint(v 127 / amax), q1 = the
  // residual * 254 (q16); element 16w + 4b + t of the lane -> byte 16w + 4t + b.
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  const float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
  int sum = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {  // output word k = 4w + t holds elements 16w + 4b + t, b = 0..3 (no packing arrays)
    uint32_t w0 = 0, w1 = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const float vs = v[16 * (k >> 2) + 4 * b + (k & 3)] * inv;
      const float q0f = rintf(vs);
      const int q0 = max(-127, min(127, int(q0f)));
      w0 |= uint32_t(q0 & 0xff) << (8 * b);
      if constexpr (LV == 2) {
        const int q1 = max(-127, min(127, __float2int_rn((vs - q0f) * 254.f)));
        w1 |= uint32_t(q1 & 0xff) << (8 * b);
        sum += 254 * q0 + q1;
      } else {
        sum += q0;
      }
    }
    reinterpret_cast<uint32_t*>(xq + e0)[k] = w0;
    if constexpr (LV == 2) reinterpret_cast<uint32_t*>(xq + K + e0)[k] = w1;
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);  // a 64-chunk is two lanes
  if ((lane & 1) == 0) xds[e0 >> 6] = make_float2(LV == 2 ? d / 254.f : d, float(sum));
}

// The whole row's site by the NW consumer warps of a block (warp w, named barrier 1 over NW warps): xq / xds into
// shared memory; red: shared float [NW] (AddNorm's sums of squares). Ends with the barrier: xq / xds are complete.
template <int LV>
__device__ __forceinline__ void site_prologue(const SitePrologue& s, int K, int NW, int w, int lane, int8_t* xq,
                                              float2* xds, float* red) {
  if (s.active == 2) {  // timing only (Options::site_prologue bit 64): no site computed, the results are wrong
    asm volatile("bar.sync 1, %0;" ::"r"(NW * 32) : "memory");
    return;
  }
  float rr = 0.f;
  if (s.pre == kPreAddNorm) {  // the row's sum of squares (src + resid), warp partials summed in warp order
    float ss = 0.f;
    for (int e = 4 * (w * 32 + lane); e < K; e += 4 * 32 * NW) {
      float4 a = *reinterpret_cast<const float4*>(s.src + e);
      if (s.resid) {
        const float4 b = *reinterpret_cast<const float4*>(s.resid + e);
        a = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
      }
      ss += sq4(a);
    }
    ss = warp_sum(ss);
    if (lane == 0) red[w] = ss;
    asm volatile("bar.sync 1, %0;" ::"r"(NW * 32) : "memory");
    float t = 0.f;
    for (int i = 0; i < NW; ++i) t += red[i];
    rr = rsqrtf(t / float(K) + s.eps);
  }
  const bool write_pre = s.pre_out && blockIdx.x == 0;
  for (int c = w; c < (K >> 10); c += NW) site_chunk1024<LV>(s, K, c << 10, lane, rr, write_pre, xq, xds);
  asm volatile("bar.sync 1, %0;" ::"r"(NW * 32) : "memory");
}

// AddNorm with a residual, by the producer warp of every block once its last copy is issued: wait until every
// block's consumers have read h (count[0] == blocks), write this block's slice h += delta (the prologue's sum,
// bit-identical: a + b is commutative), count the departure; the last zeroes both counters for the next launch.
__device__ __forceinline__ void site_prologue_resid(const SitePrologue& s, int K, int lane) {
  if (lane == 0) {
    int seen;
    do {
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(s.count) : "memory");
    } while (seen < int(gridDim.x));
  }
  __syncwarp();
  const int e0 = int(int64_t(K) * blockIdx.x / gridDim.x), e1 = int(int64_t(K) * (blockIdx.x + 1) / gridDim.x);
  for (int e = e0 + lane; e < e1; e += 32) s.resid[e] = s.src[e] + s.resid[e];
  __syncwarp();
  if (lane == 0) {
    __threadfence();
    if (atomicAdd(s.count + 1, 1) == int(gridDim.x) - 1) {
      atomicExch(s.count, 0);
      atomicExch(s.count + 1, 0);
    }
  }
}

}  // namespace bonsai::cuda
