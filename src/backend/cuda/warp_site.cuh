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

}  // namespace bonsai::cuda
