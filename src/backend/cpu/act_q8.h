// An activation site quantised to int8 digits for the integer ternary kernels (layout: kernels.h), held in
// per-thread scratch of the calling thread so the hot path does not allocate once warmed up.
#pragma once
#include <cstdint>

namespace bonsai::cpu {

struct ActQ8 {
  const int8_t* q;      // int8  [M, levels, K]      int8 digits, plane-permuted per 256-chunk (kernels.h)
  const float* scale;   // fp32  [M, K/128]          s_g = amax_g / 127
  const int32_t* sum;   // int32 [M, levels, K/128]  sum of each digit per group
  int levels;           // 1, 2 or 3 digits
};

// Quantises x fp32 [M, K] (K % 128 == 0) to `levels` int8 digits with kernels().quantize_q8, rows spread
// over the thread pool. The result stays valid until the calling thread's next quantize_activation.
ActQ8 quantize_activation(const float* x, int64_t M, int64_t K, int levels = 1);

}  // namespace bonsai::cpu
