// The dp4a dot product of canonical ternary words with the transposed int8 activation (ternary.cu's
// header comment has the layout), shared by the matvec kernels (nvcc only).
#pragma once
#include <cstdint>

#include "backend/cuda/common.cuh"

namespace bonsai::cuda {

// 4 codes (one per byte, low 2 bits) -> 4 signed int8 code - 1, without carries between bytes (the GEMMs'
// weight fragments / tiles).
__device__ __forceinline__ uint32_t decode4(uint32_t w) { return ((w & 0x03030303u) + 0x7F7F7F7Fu) ^ 0x80808080u; }

// GEMM v3's A fragments of one 128-group (the wgmma_rs layout) from a raw stage (gemm3_kernel and the ceiling probe,
// wgmma_probe.cu). rw = row g's 8 words, row g + 8's at rw + 8 stride (stride: words per
// raw row). Word j of a row holds element 16 j + 4 b + i at bits 8 b + 2 i and the transposed activation holds it at
// position 16 j + 4 i + b, so decode4(w >> 2 q) of words 2 ks and 2 ks + 1 are k bytes 4q.. and 16+4q.. of k-step ks.
__device__ __forceinline__ void v3_fragments(const uint32_t* rw, int stride, int q, uint32_t (&af)[4][4]) {
  const uint4 lo0 = *reinterpret_cast<const uint4*>(rw), lo1 = *reinterpret_cast<const uint4*>(rw + 4);
  const uint4 hi0 = *reinterpret_cast<const uint4*>(rw + 8 * stride),
              hi1 = *reinterpret_cast<const uint4*>(rw + 8 * stride + 4);
  const uint32_t wl[8] = {lo0.x, lo0.y, lo0.z, lo0.w, lo1.x, lo1.y, lo1.z, lo1.w};
  const uint32_t wh[8] = {hi0.x, hi0.y, hi0.z, hi0.w, hi1.x, hi1.y, hi1.z, hi1.w};
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    af[ks][0] = decode4(wl[2 * ks] >> (2 * q));
    af[ks][1] = decode4(wh[2 * ks] >> (2 * q));
    af[ks][2] = decode4(wl[2 * ks + 1] >> (2 * q));
    af[ks][3] = decode4(wh[2 * ks + 1] >> (2 * q));
  }
}

// d = a (4 unsigned bytes) . b (4 signed bytes) + c
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// sum over the 64 weights of a chunk of code * q (codes unsigned 0..3).
__device__ __forceinline__ int chunk_dot(const uint4 w, const int4 x0, const int4 x1, const int4 x2, const int4 x3) {
  int a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  const int4 xs[4] = {x0, x1, x2, x3};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    a0 = dp4a_us(ws[k] & 0x03030303u, xs[k].x, a0);
    a1 = dp4a_us(ws[k] & 0x0C0C0C0Cu, xs[k].y, a1);
    a2 = dp4a_us(ws[k] & 0x30303030u, xs[k].z, a2);
    a3 = dp4a_us(ws[k] & 0xC0C0C0C0u, xs[k].w, a3);
  }
  // a_j = 4^j * sum(code * q) exactly, so the shifts are exact.
  return a0 + (a1 >> 2) + (a2 >> 4) + (a3 >> 6);
}

// q16 activations (two int8 digits per element, base 254; ternary.cu's header): 254 * sum(code * q0) +
// sum(code * q1) over the chunk's 64 weights. The masked weight bytes are formed ONCE and meet both digit
// planes (4 LOP3 + 8 dp4a per 16 weights). Each a_j * 254 + b_j is still a multiple of 4^j, so the
// shifts stay exact; |result| <= 64 * 3 * 127 * 255 < 2^23.
__device__ __forceinline__ int chunk_dot2(const uint4 w, const int4 (&p0)[4], const int4 (&p1)[4]) {
  int a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0;
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t m0 = ws[k] & 0x03030303u, m1 = ws[k] & 0x0C0C0C0Cu, m2 = ws[k] & 0x30303030u,
                   m3 = ws[k] & 0xC0C0C0C0u;
    a0 = dp4a_us(m0, p0[k].x, a0);
    a1 = dp4a_us(m1, p0[k].y, a1);
    a2 = dp4a_us(m2, p0[k].z, a2);
    a3 = dp4a_us(m3, p0[k].w, a3);
    b0 = dp4a_us(m0, p1[k].x, b0);
    b1 = dp4a_us(m1, p1[k].y, b1);
    b2 = dp4a_us(m2, p1[k].z, b2);
    b3 = dp4a_us(m3, p1[k].w, b3);
  }
  return (a0 * 254 + b0) + ((a1 * 254 + b1) >> 2) + ((a2 * 254 + b2) >> 4) + ((a3 * 254 + b3) >> 6);
}

}  // namespace bonsai::cuda
