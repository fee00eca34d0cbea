// Device code for the activation site of a few rows (pre-op, sign, blockwise FWHT, 1/sqrt(n), int8 quantisation per
// 128-group in the transposed layout the ternary kernels read: ternary.cu's header). Every element goes through the
// same operations in the same order as site_kernel (strides h = 1, 2, 4, ..., a + b / a - b, then * norm; the same
// quantiser), so the int8 activation is bit-identical to the site kernel's for the elementwise pre-ops (the norms'
// sums of squares are summed in other orders).
// - warp_site_chunk (q8): one warp per 1024 elements, 32 a lane (strides < 32 in the lane, 32..512 by
//   shuffles), the prologue of the dp4a matvec v3 (Options::fuse_site).
// - the slot functions (round 11): 8 elements a thread, 4 warps per 1024-block (strides 1-4 in the thread, 8-128 by
//   shuffles, 256 / 512 in one shared-memory exchange): the decode-row site kernel (site_row.cu) and the v7 matvec's
//   prologue (site_prologue, Options::site_prologue; its AddNorm residual protocol: site_prologue_resid).
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

// A lane's 32 consecutive floats from p (16-byte aligned) as 8 float4 loads.
__device__ __forceinline__ void lane_load32(const float* p, float (&v)[32]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float4 f = *reinterpret_cast<const float4*>(p + 4 * k);
    v[4 * k] = f.x, v[4 * k + 1] = f.y, v[4 * k + 2] = f.z, v[4 * k + 3] = f.w;
  }
}
// The two-operand pre-ops on a lane's 32 elements (row elements e0 .. e0 + 31, the warp's lanes adjacent): v = silu(v)
// u, v sigmoid(u), or (GatedNorm) rmsnorm over each seg-long segment (seg / 32 adjacent lanes) * gain * silu(u).
__device__ __forceinline__ void lane_pre_op32(int32_t pre, float (&v)[32], const float (&u)[32], int32_t seg, float eps,
                                              const float* gain, int64_t e0) {
  if (pre == kPreSiluMul) {
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = siluf_(v[j]) * u[j];
  } else if (pre == kPreSigmoidMul) {
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = v[j] * sigmoidf_(u[j]);
  } else {
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < 32; ++j) ss += v[j] * v[j];
    for (int o = 1; o < seg / 32; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float rr = rsqrtf(ss / float(seg) + eps);
    const int64_t g0 = e0 % seg;
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = v[j] * rr * gain[g0 + j] * siluf_(u[j]);
  }
}

// Chunk [c0, c0 + 1024) of the row -> xq [c0 .. c0+1024) int8 and xds [c0/64 .. c0/64 + 16) (smem or
// global). All 32 lanes of the warp call it together.
__device__ __forceinline__ void warp_site_chunk(const WarpSite& s, int64_t c0, int lane, int8_t* xq, float2* xds) {
  const int64_t base = c0 + 32 * lane;
  float v[32];
  lane_load32(s.src + base, v);
  if (s.pre == kPreSiluMul || s.pre == kPreSigmoidMul || s.pre == kPreGatedNorm) {
    float u[32];
    lane_load32(s.src2 + base, u);
    lane_pre_op32(s.pre, v, u, s.seg, s.eps, s.gain, base);
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
  int32_t seg;           // GatedNorm segment: a power of two in [8, 256] (inside one warp's 256 elements)
  int32_t active;        // 0: no site (the kernel reads a ready int8 activation); 2: timing only, no site computed
  float eps, norm;       // norm eps; 1/sqrt(n)
  int32_t nparts, pad_;  // round 30: src as nparts partial sums [nparts][part_stride] (site_row_norm_kernel only)
  int64_t part_stride;
};

// ---- one SLOT = 8 consecutive elements of a thread; 4 warps (128 slots) hold one 1024-block --------------------------
// Why this shape: one warp per 1024-block (32 elements a lane) was measured at 8-10 us per row (a long dependent
// chain per warp, few warps); with 8 elements a slot, strides 1-4 stay in the thread, 8-128 are shuffles, and 256 /
// 512 go through shared memory in one exchange (4 x 8 floats per slot). Same operations in the same order as the
// site kernels (pre-op, signs, a + b / a - b per stride from 1 up, * norm, the quantiser), so the digits are theirs bit
// for bit for the elementwise pre-ops.
// The kernel-argument form of a site description (host side): its operands, pre-op, Hadamard block; pre_out and resid
// as given (the launcher decides which it lets the kernel write), count unset.
inline SitePrologue site_prologue_of(const SiteDesc& d) {
  SitePrologue s{};
  s.src = d.src;
  s.src2 = d.src2;
  s.gain = d.gain;
  s.signs = d.signs;
  s.resid = d.resid;
  s.pre_out = d.pre_out;
  s.pre = d.pre;
  s.seg = d.seg;
  s.eps = d.eps;
  while ((int64_t(1) << s.log2n) < d.n) ++s.log2n;
  s.norm = float(1.0 / __builtin_sqrt(double(d.n)));
  s.active = 1;
  s.nparts = d.nparts;
  s.part_stride = d.part_stride;
  return s;
}

// Round 28: exact cheaper forms of the warp site's steps (ncu of the prefill row-unit site, K 5,120: ~2,000 warp
// instructions a chunk, 0.61 issued per scheduler, so fewer instructions are time), used by the warp sites (ternary.cu)
// and the slots below:
// - sign_flip: v * s for a sign byte s = +-1 as an XOR of the sign bit (the I2F + FMUL it replaces: the same value, NaNs
//   aside).
// - butterfly: (lane & m) ? p - v : v + p as fma(+-1, v, p): one FFMA, where the select compiled to 2 FADD + FSEL
//   (x * -1 is exact, so the one rounding is the subtraction's).
// - rint_bits: rint(x) and its int for |x| < 2^22 by adding 1.5 x 2^23 (round to nearest even in the low mantissa
//   bits), instead of FRND and F2I on the quarter-rate conversion pipe; the same values.
// - pack4: 4 ints' low bytes into one word by 3 PRMT instead of a mask, shift and OR each.
__device__ __forceinline__ float sign_flip(float v, uint32_t sign_word, int b) {
  return __int_as_float(__float_as_int(v) ^ int((sign_word << (24 - 8 * b)) & 0x80000000u));
}
__device__ __forceinline__ float butterfly(float v, float p, bool upper) { return fmaf(upper ? -1.f : 1.f, v, p); }
__device__ __forceinline__ float rint_bits(float x, int& i) {
  const float t = __fadd_rn(x, 12582912.f);  // 1.5 x 2^23
  i = __float_as_int(t) - 0x4B400000;
  return __fsub_rn(t, 12582912.f);
}
__device__ __forceinline__ uint32_t pack4(int b0, int b1, int b2, int b3) {
  return __byte_perm(__byte_perm(b0, b1, 0x0040), __byte_perm(b2, b3, 0x0040), 0x5410);
}

__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
// src (+ resid for AddNorm) of the slot at element e of s's row.
__device__ __forceinline__ void site_slot_load(const SitePrologue& s, int e, float (&v)[8]) {
  load8(s.src + e, v);
  if (s.pre == kPreAddNorm && s.resid) {
    float r[8];
    load8(s.resid + e, r);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = v[j] + r[j];
  }
}
// The slot's 8 signs applied (sign_flip): bytes of s0 for elements e .. e + 3, of s1 for e + 4 .. e + 7.
__device__ __forceinline__ void site_slot_signs(uint32_t s0, uint32_t s1, float (&v)[8]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = sign_flip(v[j], s0, j), v[j + 4] = sign_flip(v[j + 4], s1, j);
}
// FWHT strides 1..min(n, 256) / 2 of an n-point transform on the slot: 1-4 in the thread, 8-128 by shuffles (all 32
// lanes of the warp call it together).
__device__ __forceinline__ void site_slot_strides(int n, int lane, float (&v)[8]) {
#pragma unroll
  for (int h = 1; h < 8; h <<= 1) {
    if (h < n) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if ((j & h) == 0) {
          const float a = v[j], b = v[j + h];
          v[j] = a + b;
          v[j + h] = a - b;
        }
    }
  }
  for (int h = 8; h < n && h < 256; h <<= 1) {
    const int m = h >> 3;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float p = __shfl_xor_sync(0xffffffffu, v[j], m);
      v[j] = butterfly(v[j], p, lane & m);
    }
  }
}
// The slot up to the shared-memory strides: its values (loaded unless `held`), the pre-op (AddNorm: * rr * gain),
// pre_out (the pre-op's result, when asked), signs, FWHT strides 1..min(n, 256) / 2.
__device__ __forceinline__ void site_slot_front(const SitePrologue& s, int e, int lane, float rr, bool held,
                                                float* pre_out, float (&v)[8]) {
  if (!held) site_slot_load(s, e, v);
  if (s.pre == kPreAddNorm) {  // v = src (+ resid); v * rr * gain (site_kernel's order)
    float gn[8];
    load8(s.gain + e, gn);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = v[j] * rr * gn[j];
  } else if (s.pre != kPreNone) {
    float u[8];
    load8(s.src2 + e, u);
    if (s.pre == kPreSiluMul) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = siluf_(v[j]) * u[j];
    } else if (s.pre == kPreSigmoidMul) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = v[j] * sigmoidf_(u[j]);
    } else {  // GatedNorm: rmsnorm over each seg-long segment (seg / 8 adjacent slots, <= 32) * gain * silu(z)
      float ss = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
      for (int o = 1; o < s.seg / 8; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      const float rg = rsqrtf(ss / float(s.seg) + s.eps);
      const int g0 = e % s.seg;
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = v[j] * rg * s.gain[g0 + j] * siluf_(u[j]);
    }
  }
  if (pre_out && s.pre != kPreNone) store8(pre_out + e, v);
  if (s.signs) {
    site_slot_signs(*reinterpret_cast<const uint32_t*>(s.signs + e), *reinterpret_cast<const uint32_t*>(s.signs + e + 4), v);
  }
  site_slot_strides(1 << s.log2n, lane, v);
}
// Strides 256 (warps wq ^ 1) and 512 (wq ^ 2) of an n > 256 transform, after every slot of the group stored its values
// at gs0 + slot * 8 and a barrier: a + b / a - b in stride order. Own values are read back from shared memory too, so
// no register array is indexed by the warp number; a float4 half at a time.
__device__ __forceinline__ void site_slot_exchange(int n, int wq, int lane, const float* gs0, float (&v)[8]) {
  const float* gs = gs0 + lane * 8;  // slot `lane` of warp k at gs + 256 k
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float4 x[4];
    if (n > 512) {
#pragma unroll
      for (int k = 0; k < 4; ++k) x[k] = reinterpret_cast<const float4*>(gs + k * 256)[hf];
    } else {
      x[0] = reinterpret_cast<const float4*>(gs + (wq & 2) * 256)[hf];
      x[1] = reinterpret_cast<const float4*>(gs + ((wq & 2) | 1) * 256)[hf];
    }
    const float* a = reinterpret_cast<const float*>(&x[0]);
    const float* b = reinterpret_cast<const float*>(&x[1]);
    const float* c = reinterpret_cast<const float*>(&x[2]);
    const float* d = reinterpret_cast<const float*>(&x[3]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (n > 512) {
        const float s0 = a[i] + b[i], d0 = a[i] - b[i], s1 = c[i] + d[i], d1 = c[i] - d[i];
        v[4 * hf + i] = wq == 0 ? s0 + s1 : wq == 1 ? d0 + d1 : wq == 2 ? s0 - s1 : d0 - d1;
      } else {
        v[4 * hf + i] = (wq & 1) ? a[i] - b[i] : a[i] + b[i];
      }
    }
  }
}
// * norm, the fp32 site (dst, when asked), the quantiser per 128-group (16 slots): d = amax / 127, q0 = rint(v 127 /
// amax), q1 = the residual * 254 (q16); xq: the row's LV digit planes of K bytes; xds: its [K/64]. The slot holds half
// of a 16-element word: element 4b + j of the word (b = 2 (slot & 1) + (i >> 2), j = i & 3 for the slot's i) goes to
// byte 4j + b, so bytes 4j + 2 (slot & 1) and + 1 are one u16. All 32 lanes of the warp call it together.
template <int LV>
__device__ __forceinline__ void site_slot_quantise(const SitePrologue& s, int K, int e, int lane, float* dst,
                                                   int8_t* xq, float2* xds, float (&v)[8]) {
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    v[j] *= s.norm;
    amax = fmaxf(amax, fabsf(v[j]));
  }
  if (dst) store8(dst + e, v);
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
  int sum = 0;
  int8_t* wb = xq + (e & ~15) + 2 * ((e >> 3) & 1);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t h0 = 0, h1 = 0;
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const float vs = v[j + 4 * hi] * inv;
      int qi;
      const float q0f = rint_bits(vs, qi);  // |vs| <= 127
      const int q0 = max(-127, min(127, qi));
      h0 |= uint32_t(q0 & 0xff) << (8 * hi);
      if constexpr (LV == 2) {
        int ri;
        rint_bits((vs - q0f) * 254.f, ri);
        const int q1 = max(-127, min(127, ri));
        h1 |= uint32_t(q1 & 0xff) << (8 * hi);
        sum += 254 * q0 + q1;
      } else {
        sum += q0;
      }
    }
    *reinterpret_cast<uint16_t*>(wb + 4 * j) = uint16_t(h0);
    if constexpr (LV == 2) *reinterpret_cast<uint16_t*>(wb + K + 4 * j) = uint16_t(h1);
  }
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);  // a 64-chunk is 8 slots
  if ((lane & 7) == 0) xds[e >> 6] = make_float2(LV == 2 ? d / 254.f : d, float(sum));
}

// The whole row's site by the NW consumer warps of a v7 block (named barrier 1 over NW warps) into shared memory: xq,
// xds; 4-warp groups, a 1024-block each per round. scratch: float [NW / 4][128][8]; red: float [NW] (AddNorm's sum of
// squares). Ends with the barrier: xq / xds are complete.
template <int LV>
__device__ __forceinline__ void site_prologue(const SitePrologue& s, int K, int NW, int w, int lane, int8_t* xq,
                                              float2* xds, float* red, float* scratch) {
  auto bar = [&] { asm volatile("bar.sync 1, %0;" ::"r"(NW * 32) : "memory"); };
  if (s.active == 2) {  // timing only (Options::site_prologue bit 64): no site computed, the results are wrong
    bar();
    return;
  }
  const int groups = NW >> 2, g = w >> 2, wq = w & 3, t = (wq << 5) | lane;  // t: slot in the group, 0..127
  const int blocks = K >> 10, rounds = (blocks + groups - 1) / groups;
  const int n = 1 << s.log2n;
  float v[8];
  float rr = 0.f;
  bool held = false;  // v already holds round 0's src (+ resid)
  if (s.pre == kPreAddNorm) {  // the row's sum of squares (src + resid), warp partials summed in warp order
    float ss = 0.f;
    for (int r = 0; r < rounds; ++r) {
      const int blk = r * groups + g;
      if (g < groups && blk < blocks) {
        site_slot_load(s, (blk << 10) + 8 * t, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
      }
    }
    held = rounds == 1;
    ss = warp_sum(ss);
    if (lane == 0) red[w] = ss;
    bar();
    float tot = 0.f;
    for (int i = 0; i < NW; ++i) tot += red[i];
    rr = rsqrtf(tot / float(K) + s.eps);
  }
  // AddNorm: block 0 writes the normed row (the GDN a/b projections read it).
  float* pre_out = s.pre == kPreAddNorm && blockIdx.x == 0 ? s.pre_out : nullptr;
  float* gs = scratch + g * 128 * 8;
  for (int r = 0; r < rounds; ++r) {
    const int blk = r * groups + g;
    const bool act = g < groups && blk < blocks;
    const int e = (blk << 10) + 8 * t;
    if (act) {
      site_slot_front(s, e, lane, rr, held, pre_out, v);
      if (n > 256) store8(gs + t * 8, v);
    }
    if (n > 256) {
      bar();
      if (act) site_slot_exchange(n, wq, lane, gs, v);
      if (r + 1 < rounds) bar();  // the scratch is rewritten next round
    }
    if (act) site_slot_quantise<LV>(s, K, e, lane, nullptr, xq, xds, v);
  }
  bar();
}

// AddNorm with a residual, by the producer warp of every block once its last copy is issued: wait until every
// block's consumers have read h (count[0] == blocks), write this block's slice h += delta (the prologue's sum,
// bit-identical: a + b is commutative), count the departure; the last zeroes both counters for the next launch.
__device__ __forceinline__ void site_prologue_resid(const SitePrologue& s, int K, int lane) {
  if (lane == 0) poll_until_at_least(s.count, int(gridDim.x));
  __syncwarp();
  const int e0 = int(int64_t(K) * blockIdx.x / gridDim.x), e1 = int(int64_t(K) * (blockIdx.x + 1) / gridDim.x);
  for (int e = e0 + lane; e < e1; e += 32) s.resid[e] = s.src[e] + s.resid[e];
  __syncwarp();
  if (lane == 0) {
    __threadfence();
    depart_and_reset(s.count, int(gridDim.x));
  }
}

}  // namespace bonsai::cuda
