// The dp4a dot product of canonical ternary words with the transposed int8 activation (ternary.cu's
// header comment has the layout), shared by the matvec kernels (nvcc only).
#pragma once
#include <cstdint>

#include "backend/cuda/common.cuh"

namespace bonsai::cuda {

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

}  // namespace bonsai::cuda
