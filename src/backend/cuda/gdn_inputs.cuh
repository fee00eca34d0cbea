// The GDN mixer's per-token input pieces, shared by the kernels that compute them (elementwise.cu: conv_block,
// dense_block) and the decode delta step that computes them in its own launch (delta_rule.cu, round 29): one definition
// of each sum, so the fused step's values are the separate kernels' bit for bit.
#pragma once

#include <cuda_bf16.h>

#include "backend/cuda/common.cuh"

namespace bonsai::cuda {

constexpr int kMaxConvKernel = 8;  // conv taps Kc supported

// 8 consecutive weights of row w starting at element i (16-byte loads; i % 8 == 0), as fp32.
template <bool BF16>
__device__ __forceinline__ void wload8(const void* w, int64_t i, float (&f)[8]) {
  if constexpr (BF16) {
    const uint4 u = *reinterpret_cast<const uint4*>(reinterpret_cast<const __nv_bfloat16*>(w) + i);
    const uint32_t v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      f[2 * k] = __uint_as_float(v[k] << 16);
      f[2 * k + 1] = __uint_as_float(v[k] & 0xffff0000u);
    }
  } else {
    const float4 a = *reinterpret_cast<const float4*>(reinterpret_cast<const float*>(w) + i);
    const float4 b = *reinterpret_cast<const float4*>(reinterpret_cast<const float*>(w) + i + 4);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  }
}

// One 8-element step of a dense row's dot product: sum f[e] x[e] in this order (x = x0 | x1).
__device__ __forceinline__ float dot8(const float (&f)[8], float4 x0, float4 x1) {
  return f[0] * x0.x + f[1] * x0.y + f[2] * x0.z + f[3] * x0.w + f[4] * x1.x + f[5] * x1.y + f[6] * x1.z + f[7] * x1.w;
}

// One token of the causal depthwise conv + SiLU of one channel: win[0 .. P - 1] the channel's last P = Kc - 1 inputs
// (oldest first), xv this token's input, tap[0 .. P] its taps. Then win becomes the new state (shifted, xv last).
__device__ __forceinline__ float conv_token(const float (&tap)[kMaxConvKernel], float (&win)[kMaxConvKernel], float xv,
                                            int P) {
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) {
    if (j < P) acc += tap[j] * win[j];
    else if (j == P) acc += tap[j] * xv;
  }
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) {
    if (j + 1 < P) win[j] = win[j + 1];
    else if (j + 1 == P) win[j] = xv;
  }
  return siluf_(acc);
}

}  // namespace bonsai::cuda
